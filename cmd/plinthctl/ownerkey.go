package main

import (
	"context"
	"crypto/ed25519"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"os"
	"path/filepath"

	"github.com/spf13/pflag"
	"golang.org/x/term"

	"plinth.dev/plinth/roleserver/identity"
	"plinth.dev/plinth/roleserver/owner"
)

func init() {
	add(spec{path: "cluster owner-key", short: "Replace the owner key (every certificate of the old one is revoked), or keep it encrypted with a passphrase",
		long: "Exactly one of:\n" +
			"  --rotate   replace the owner key with a new one; the cluster revokes every certificate of the old one\n" +
			"  --encrypt  keep owner.key encrypted with a passphrase (asked on the terminal, or $" + owner.PassphraseEnv + ")\n" +
			"  --decrypt  keep owner.key in the clear again",
		maxArgs: 0, new: func() command { return new(ownerKeyCmd) }})
	owner.Passphrase = askPassphrase
}

// ownerKeyCmd is `plinthctl cluster owner-key (--rotate | --encrypt |
// --decrypt)`:
//
//	--rotate   a new owner key replaces the old: the cluster revokes every
//	           certificate of the old one and moves the owner's Kubernetes
//	           credentials to a new epoch; the new key's owner certificate
//	           is taken and saved in place of the old (encrypted as the old
//	           key was)
//	--encrypt  owner.key is kept encrypted with a passphrase (age, scrypt):
//	           asked on the terminal, or $PLINTH_OWNER_PASSPHRASE
//	--decrypt  owner.key is kept in the clear again
//
// Rotate when the owner key may have been copied: the copy opens the
// cluster until then. Whoever holds the old key can rotate too, first:
// rotate as soon as a copy is suspected.
type ownerKeyCmd struct {
	rotate, encrypt, decrypt bool
}

func (c *ownerKeyCmd) flags(fs *pflag.FlagSet) {
	fs.BoolVar(&c.rotate, "rotate", false, "replace the owner key with a new one; the old one's certificates are revoked")
	fs.BoolVar(&c.encrypt, "encrypt", false, "keep owner.key encrypted with a passphrase")
	fs.BoolVar(&c.decrypt, "decrypt", false, "keep owner.key in the clear")
}

func (c *ownerKeyCmd) run(ctx context.Context, e *env, _ []string) error {
	n := 0
	for _, b := range []bool{c.rotate, c.encrypt, c.decrypt} {
		if b {
			n++
		}
	}
	if n != 1 {
		return usagef("give exactly one of --rotate, --encrypt and --decrypt")
	}
	cfg, err := owner.LoadConfig(e.config)
	if errors.Is(err, os.ErrNotExist) {
		return fmt.Errorf("no owner configuration in %s (run plinthctl cluster takeownership, or pass --config)", e.config)
	}
	if err != nil {
		return err
	}
	if cfg.Key == nil {
		return fmt.Errorf("no owner key in %s", e.config)
	}
	switch {
	case c.encrypt:
		if cfg.KeyPassphrase, err = newPassphrase(); err != nil {
			return err
		}
		fmt.Fprintf(e.stdout, "owner key in %s encrypted: plinthctl asks for its passphrase (or reads $%s)\n", e.config, owner.PassphraseEnv)
		return cfg.Save()
	case c.decrypt:
		cfg.KeyPassphrase = nil
		fmt.Fprintf(e.stdout, "owner key in %s kept in the clear\n", e.config)
		return cfg.Save()
	}
	return c.rotateKey(ctx, e, cfg)
}

// rotateKey replaces cfg's key with a new one, and saves the new key and
// its certificate (the old key's file is overwritten: its certificates
// are revoked, and it opens nothing any more). The curators asked are
// --endpoint's if given, else cfg's; cfg keeps its own.
//
// The new key is written to owner.key.next before any curator is asked,
// and a rotation that failed is resumed with it: once the cluster has
// swapped keys, the old one opens nothing (TestOwnerKeyRotationResumed).
func (c *ownerKeyCmd) rotateKey(ctx context.Context, e *env, cfg *owner.Config) error {
	next, err := nextOwnerKey(e, cfg)
	if err != nil {
		return err
	}
	cl, err := e.dialWith(cfg)
	if err != nil {
		return err
	}
	defer cl.Close()
	ctx, cancel := context.WithTimeout(ctx, 2*callTimeout)
	defer cancel()
	var lastErr error
	curators := cfg.Curators
	if len(e.endpoints) > 0 {
		curators = e.endpoints
	}
	for _, ep := range curators {
		nc, resp, err := cl.RotateOwnerKey(ctx, next, ep)
		if resp == nil {
			lastErr = err
			continue
		}
		if serr := c.saveRotated(e, cfg, next, nc); serr != nil {
			return serr
		}
		if err != nil {
			return err
		}
		fmt.Fprintf(e.stdout, "owner key replaced: ed25519 %s; %d certificates of the old key revoked; the owner's Kubernetes credentials are at epoch %d\n",
			hex.EncodeToString(next.Public().(ed25519.PublicKey)), resp.GetRevoked(), resp.GetKubernetesOwnerEpoch())
		return nil
	}
	return fmt.Errorf("no curator rotated the owner key: %w (the new key stays in %s: plinthctl cluster owner-key --rotate again finishes the rotation with it)",
		lastErr, filepath.Join(e.config, owner.NextKeyFile))
}

// nextOwnerKey is the key of a rotation that did not finish, or a new
// one, saved as the next key before the cluster learns of it.
func nextOwnerKey(e *env, cfg *owner.Config) (ed25519.PrivateKey, error) {
	next, err := cfg.NextKey()
	if err != nil {
		return nil, err
	}
	if next != nil {
		fmt.Fprintf(e.stderr, "plinthctl: resuming the rotation to the key in %s\n", filepath.Join(e.config, owner.NextKeyFile))
		return next, nil
	}
	if _, next, err = ed25519.GenerateKey(rand.Reader); err != nil {
		return nil, err
	}
	return next, cfg.SaveNextKey(next)
}

// saveRotated keeps next as the owner key, with its certificate nc if
// taken; without one, the old key's certificate and CA go, and plinthctl
// cluster takeownership with the new key takes a certificate.
func (c *ownerKeyCmd) saveRotated(e *env, cfg *owner.Config, next ed25519.PrivateKey, nc *identity.Credentials) error {
	cfg.Key, cfg.Credentials = next, nc
	if nc == nil {
		for _, f := range []string{owner.CertFile, owner.CAFile} {
			if err := os.Remove(filepath.Join(e.config, f)); err != nil && !errors.Is(err, os.ErrNotExist) {
				return err
			}
		}
	}
	if err := cfg.Save(); err != nil {
		return fmt.Errorf("the owner key is replaced, but saving it as %s failed (%v): it is in %s", owner.KeyFile, err, owner.NextKeyFile)
	}
	if err := cfg.DropNextKey(); err != nil {
		return err
	}
	// The old key's Kubernetes certificates are revoked with it: kubectl
	// must not be handed the cached one.
	if err := os.Remove(filepath.Join(e.config, kubeCredentialFile)); err != nil && !errors.Is(err, os.ErrNotExist) {
		return err
	}
	return nil
}

// askPassphrase reads the owner key's passphrase from
// $PLINTH_OWNER_PASSPHRASE, else from the terminal.
func askPassphrase(path string) ([]byte, error) {
	if p := os.Getenv(owner.PassphraseEnv); p != "" {
		return []byte(p), nil
	}
	if !term.IsTerminal(int(os.Stdin.Fd())) {
		return nil, fmt.Errorf("%s is encrypted: give its passphrase in $%s (no terminal to ask on)", path, owner.PassphraseEnv)
	}
	fmt.Fprintf(os.Stderr, "passphrase of %s: ", path)
	p, err := term.ReadPassword(int(os.Stdin.Fd()))
	fmt.Fprintln(os.Stderr)
	return p, err
}

// newPassphrase asks for a new passphrase twice (or takes
// $PLINTH_OWNER_PASSPHRASE).
func newPassphrase() ([]byte, error) {
	if p := os.Getenv(owner.PassphraseEnv); p != "" {
		return []byte(p), nil
	}
	if !term.IsTerminal(int(os.Stdin.Fd())) {
		return nil, fmt.Errorf("no terminal to ask for a passphrase on: give it in $%s", owner.PassphraseEnv)
	}
	fmt.Fprint(os.Stderr, "new passphrase: ")
	a, err := term.ReadPassword(int(os.Stdin.Fd()))
	fmt.Fprintln(os.Stderr)
	if err != nil {
		return nil, err
	}
	fmt.Fprint(os.Stderr, "again: ")
	b, err := term.ReadPassword(int(os.Stdin.Fd()))
	fmt.Fprintln(os.Stderr)
	if err != nil {
		return nil, err
	}
	if string(a) != string(b) || len(a) == 0 {
		return nil, errors.New("the passphrases differ, or are empty")
	}
	return a, nil
}
