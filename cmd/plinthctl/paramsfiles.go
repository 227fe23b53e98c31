package main

import (
	"bytes"
	"crypto/ed25519"
	"crypto/x509"
	"encoding/base64"
	"encoding/binary"
	"encoding/pem"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"

	"plinth.dev/plinth/api/nodepb"
)

// Parsing and file helpers of plinthctl params: the key and certificate
// forms it reads, and how it writes files without leaving half-written
// ones behind.

func parseStorage(s string) (nodepb.StorageSecurity, error) {
	switch s {
	case "":
		return nodepb.StorageSecurity_STORAGE_SECURITY_UNSPECIFIED, nil
	case "encrypted":
		return nodepb.StorageSecurity_STORAGE_SECURITY_ENCRYPTED, nil
	case "authenticated":
		return nodepb.StorageSecurity_STORAGE_SECURITY_AUTHENTICATED, nil
	}
	return 0, fmt.Errorf("%q: want encrypted or authenticated", s)
}

func parseFS(s string) (nodepb.NodeStorage_Filesystem, error) {
	switch s {
	case "":
		return nodepb.NodeStorage_FILESYSTEM_UNSPECIFIED, nil
	case "ext4":
		return nodepb.NodeStorage_FILESYSTEM_EXT4, nil
	case "xfs":
		return nodepb.NodeStorage_FILESYSTEM_XFS, nil
	}
	return 0, fmt.Errorf("%q: want ext4 or xfs", s)
}

// readOwnerKey accepts the forms an operator is likely to have: the
// owner.pub this command writes (PKIX PEM), an OpenSSH ed25519 public key,
// or the raw 32 bytes.
func readOwnerKey(path string) ([]byte, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	if blk, _ := pem.Decode(b); blk != nil {
		if blk.Type != "PUBLIC KEY" {
			return nil, fmt.Errorf("%s: PEM block %q, want PUBLIC KEY (the private key stays with the owner)", path, blk.Type)
		}
		k, err := x509.ParsePKIXPublicKey(blk.Bytes)
		if err != nil {
			return nil, fmt.Errorf("%s: %w", path, err)
		}
		pub, ok := k.(ed25519.PublicKey)
		if !ok {
			return nil, fmt.Errorf("%s: a %T, want ed25519", path, k)
		}
		return pub, nil
	}
	if f := strings.Fields(string(b)); len(f) >= 2 && f[0] == "ssh-ed25519" {
		return parseSSHEd25519(f[1])
	}
	if len(b) == ed25519.PublicKeySize {
		return b, nil
	}
	return nil, fmt.Errorf("%s: not a PEM, OpenSSH or raw 32-byte ed25519 public key", path)
}

// parseSSHEd25519 decodes the base64 part of an OpenSSH public key line:
// string "ssh-ed25519", then string key (RFC 4253 and RFC 8709 encoding).
func parseSSHEd25519(b64 string) ([]byte, error) {
	blob, err := base64.StdEncoding.DecodeString(b64)
	if err != nil {
		return nil, fmt.Errorf("OpenSSH key: %w", err)
	}
	var parts [][]byte
	for len(blob) >= 4 && len(parts) < 2 {
		n := binary.BigEndian.Uint32(blob)
		if uint64(n) > uint64(len(blob)-4) {
			break
		}
		parts, blob = append(parts, blob[4:4+n]), blob[4+n:]
	}
	if len(parts) != 2 || string(parts[0]) != "ssh-ed25519" || len(parts[1]) != ed25519.PublicKeySize || len(blob) != 0 {
		return nil, errors.New("malformed OpenSSH ed25519 public key")
	}
	return parts[1], nil
}

// readCert takes DER, or PEM for convenience since that is how most tools
// hand out certificates; the document always carries DER.
func readCert(path string) ([]byte, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	if blk, _ := pem.Decode(b); blk != nil {
		if blk.Type != "CERTIFICATE" {
			return nil, fmt.Errorf("%s: PEM block %q, want CERTIFICATE", path, blk.Type)
		}
		return blk.Bytes, nil
	}
	return b, nil
}

// writeOwnerKey writes the private key (PKCS#8 PEM, 0600, never replacing
// an existing file) and the public key (PKIX PEM) into dir.
func writeOwnerKey(dir string, priv ed25519.PrivateKey) error {
	privPEM, pubPEM, err := keyPairPEM(priv)
	if err != nil {
		return err
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return err
	}
	if err := writeNewFile(filepath.Join(dir, ownerKeyFile), privPEM, 0o600); err != nil {
		return err
	}
	return paramsWriteFile(filepath.Join(dir, ownerPubFile), pubPEM, 0o644)
}

// keyPairPEM is an ed25519 key as the key files hold it: the private key
// PKCS#8 PEM, the public key PKIX PEM (readOwnerKey reads it).
func keyPairPEM(priv ed25519.PrivateKey) (privPEM, pubPEM []byte, err error) {
	der, err := x509.MarshalPKCS8PrivateKey(priv)
	if err != nil {
		return nil, nil, err
	}
	pubDER, err := x509.MarshalPKIXPublicKey(priv.Public())
	if err != nil {
		return nil, nil, err
	}
	return pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: der}), pem.EncodeToMemory(&pem.Block{Type: "PUBLIC KEY", Bytes: pubDER}), nil
}

// paramsWriteFile replaces path in one step, so that a node (or QEMU) never
// reads a half-written document.
func paramsWriteFile(path string, data []byte, mode os.FileMode) error {
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		return err
	}
	f, err := os.CreateTemp(filepath.Dir(path), "."+filepath.Base(path)+".*")
	if err != nil {
		return err
	}
	defer os.Remove(f.Name())
	if _, err := io.Copy(f, bytes.NewReader(data)); err != nil {
		f.Close()
		return err
	}
	if err := f.Chmod(mode); err != nil {
		f.Close()
		return err
	}
	if err := f.Close(); err != nil {
		return err
	}
	return os.Rename(f.Name(), path)
}
