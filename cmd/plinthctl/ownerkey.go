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
func (c *ownerKeyCmd) rotateKey(ctx context.Context, e *env, cfg *owner.Config) error {
	dialCfg := *cfg
	if len(e.endpoints) > 0 {
		dialCfg.Curators = e.endpoints
	}
	cl, err := owner.Dial(&dialCfg)
	if err != nil {
		return err
	}
	defer cl.Close()
	_, next, err := ed25519.GenerateKey(rand.Reader)
	if err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(ctx, 2*callTimeout)
	defer cancel()
	var lastErr error
	for _, ep := range dialCfg.Curators {
		nc, resp, err := cl.RotateOwnerKey(ctx, next, ep)
		if resp == nil {
			lastErr = err
			continue
		}
		// Rotated: the new key is kept whatever happens next, or the
		// cluster is lost; without its certificate, plinthctl cluster
		// takeownership with it takes one.
		cfg.Key, cfg.Credentials = next, nc
		if serr := cfg.Save(); serr != nil {
			return fmt.Errorf("the owner key is replaced, but saving the new key failed (%v): it is lost", serr)
		}
		// The old key's Kubernetes certificates are revoked with it:
		// kubectl must not be handed the cached one.
		if rerr := os.Remove(filepath.Join(e.config, kubeCredentialFile)); rerr != nil && !errors.Is(rerr, os.ErrNotExist) {
			return rerr
		}
		if err != nil {
			return err
		}
		fmt.Fprintf(e.stdout, "owner key replaced: ed25519 %s; %d certificates of the old key revoked; the owner's Kubernetes credentials are at epoch %d\n",
			hex.EncodeToString(next.Public().(ed25519.PublicKey)), resp.GetRevoked(), resp.GetKubernetesOwnerEpoch())
		return nil
	}
	return fmt.Errorf("no curator rotated the owner key: %w", lastErr)
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
