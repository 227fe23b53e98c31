package owner

import (
	"bytes"
	"context"
	"crypto/ed25519"
	"crypto/sha256"
	"crypto/x509"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"

	"filippo.io/age"
	"filippo.io/age/armor"

	"plinth.dev/plinth/api/clusterpb"
	"plinth.dev/plinth/platform/atomicfile"
	"plinth.dev/plinth/platform/pki"
	"plinth.dev/plinth/roleserver/identity"
)

// The owner key at rest, and its replacement:
//
//	owner.key  PKCS#8 PEM, or that encrypted to a passphrase (age, scrypt;
//	           ASCII armour): Passphrase asks for it when the file is read
//	RotateOwnerKey  the new key signs the rotation (identity.OwnerKeyRotationMessage),
//	                the cluster revokes every certificate of the old one;
//	                the new key takes its owner certificate through Escrow
//
// Why age: a well-kept format and library (scrypt for a passphrase, the
// file authenticated), which the backups of the cluster use too; Go's
// x509 writes no encrypted PKCS#8. Guarded by TestOwnerKeyEncrypted and
// TestRotateOwnerKeyAndCRL.

// PassphraseEnv names the environment variable an encrypted owner key's
// passphrase may come from (scripts, tests); without it Passphrase asks.
const PassphraseEnv = "PLINTH_OWNER_PASSPHRASE"

// Passphrase returns the passphrase of the owner key in path. The
// default takes PassphraseEnv; plinthctl asks on its terminal.
var Passphrase = func(path string) ([]byte, error) {
	if p := os.Getenv(PassphraseEnv); p != "" {
		return []byte(p), nil
	}
	return nil, fmt.Errorf("owner: %s is encrypted: give its passphrase in $%s", path, PassphraseEnv)
}

// armorHeader starts an ASCII-armoured age file.
const armorHeader = "-----BEGIN AGE ENCRYPTED FILE-----"

// readKey reads an owner key file and the passphrase it was encrypted
// with (nil: not encrypted).
func readKey(path string) (ed25519.PrivateKey, []byte, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, nil, fmt.Errorf("owner: %w", err)
	}
	var pass []byte
	if bytes.HasPrefix(bytes.TrimSpace(b), []byte(armorHeader)) {
		if pass, err = Passphrase(path); err != nil {
			return nil, nil, err
		}
		id, err := age.NewScryptIdentity(string(pass))
		if err != nil {
			return nil, nil, fmt.Errorf("owner: %w", err)
		}
		r, err := age.Decrypt(armor.NewReader(bytes.NewReader(b)), id)
		if err != nil {
			return nil, nil, fmt.Errorf("owner: %s: not opened with this passphrase: %w", path, err)
		}
		if b, err = io.ReadAll(r); err != nil {
			return nil, nil, fmt.Errorf("owner: %s: %w", path, err)
		}
	}
	k, err := pki.ParsePrivateKeyPEM(b)
	if err != nil {
		return nil, nil, fmt.Errorf("owner: %s: %w", path, err)
	}
	return k, pass, nil
}

// keyFileBytes is owner.key's content for key: PKCS#8 PEM, encrypted to
// passphrase if it is set.
func keyFileBytes(key ed25519.PrivateKey, passphrase []byte) ([]byte, error) {
	k, err := pki.PrivateKeyPEM(key)
	if err != nil || passphrase == nil {
		return k, err
	}
	if len(passphrase) == 0 {
		return nil, errors.New("an empty passphrase protects nothing")
	}
	r, err := age.NewScryptRecipient(string(passphrase))
	if err != nil {
		return nil, err
	}
	var out bytes.Buffer
	a := armor.NewWriter(&out)
	w, err := age.Encrypt(a, r)
	if err != nil {
		return nil, err
	}
	if _, err := w.Write(k); err != nil {
		return nil, err
	}
	if err := w.Close(); err != nil {
		return nil, err
	}
	if err := a.Close(); err != nil {
		return nil, err
	}
	return out.Bytes(), nil
}

// loadTrust is the cluster CA's trust with the CRL kept in path, if any.
// A damaged file is an error: checking against no CRL would accept what
// the cluster revoked.
func loadTrust(ca *x509.Certificate, path string) (*identity.Trust, error) {
	t := identity.NewTrust(ca)
	b, err := os.ReadFile(path)
	if errors.Is(err, fs.ErrNotExist) {
		return t, nil
	}
	if err == nil {
		_, err = t.SetCRL(b)
	}
	if err != nil && !errors.Is(err, identity.ErrStaleCRL) {
		return nil, fmt.Errorf("owner: %s: %w (remove it: the next command fetches the cluster's)", path, err)
	}
	return t, nil
}

// acceptCRL takes a CRL the cluster sent (DER; nil: none) and keeps it
// in the configuration directory if it is newer than the one held.
func (c *Client) acceptCRL(der []byte) error {
	if len(der) == 0 || c.creds.Trust == nil {
		return nil
	}
	if _, err := c.creds.Trust.SetCRL(der); errors.Is(err, identity.ErrStaleCRL) {
		return nil
	} else if err != nil {
		return fmt.Errorf("owner: the cluster's CRL: %w", err)
	}
	if c.dir == "" {
		return nil
	}
	return atomicfile.Write(filepath.Join(c.dir, CRLFile), der, 0o600)
}

// RotateOwnerKey replaces the owner key with newKey (the old key's
// certificates are revoked) and returns newKey's owner credentials,
// taken through Escrow from the curator at endpoint, which must hold a
// certificate from the cluster CA.
func (c *Client) RotateOwnerKey(ctx context.Context, newKey ed25519.PrivateKey, endpoint string) (*identity.Credentials, *clusterpb.RotateOwnerKeyResponse, error) {
	pub := newKey.Public().(ed25519.PublicKey)
	req := &clusterpb.RotateOwnerKeyRequest{NewPublicKey: pub, Signature: ed25519.Sign(newKey, identity.OwnerKeyRotationMessage(c.creds.CA.Raw, pub))}
	var resp *clusterpb.RotateOwnerKeyResponse
	if err := c.management(ctx, func(m clusterpb.ManagementClient) (err error) {
		resp, err = m.RotateOwnerKey(ctx, req)
		return err
	}); err != nil {
		return nil, nil, err
	}
	creds, _, err := TakeOwnership(ctx, endpoint, newKey, WithCAFingerprint(sha256.Sum256(c.creds.CA.Raw)))
	if err != nil {
		return nil, resp, fmt.Errorf("the owner key is replaced, but the new key's certificate was not taken (plinthctl cluster takeownership with the new key takes it): %w", err)
	}
	creds.Trust = c.creds.Trust
	return creds, resp, nil
}
