package main

import (
	"context"
	"crypto/ed25519"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"os"
	"path/filepath"

	"github.com/spf13/pflag"

	"plinth.dev/plinth/platform/pki"
)

func init() {
	add(spec{path: "release key", args: "[FILE]", short: "Make a release key: it signs images (plinthctl build --sign-key), nodes install what it signed",
		long: "Make a new release key: the private key in FILE (or --file FILE), the public key in\n" +
			"FILE.pub. Neither is ever replaced: a release key lost or overwritten is gone for the cluster.",
		maxArgs: 1, new: func() command { return new(releaseKeyCmd) }})
}

// releaseKeyCmd is `plinthctl release key FILE` (or --file FILE): a new
// ed25519 release key, the private key in FILE (PKCS#8 PEM, 0600, the
// owner key's form: what build --sign-key reads) and the public key in
// FILE.pub (PKIX PEM: what cluster policy --add-release-key reads).
//
// Neither file is ever replaced: the nodes of a cluster install only
// images signed by its release keys, and take a new key only from a key
// set a current release key signed (plinthctl cluster policy
// --add-release-key --sign-key), so a release key lost or overwritten by
// mistake is gone for the cluster. Keep it offline, and keep a second
// one offline elsewhere (added the same way): whoever holds one decides
// what the nodes run.
type releaseKeyCmd struct {
	file string
}

func (c *releaseKeyCmd) flags(fs *pflag.FlagSet) {
	fs.StringVar(&c.file, "file", "", "private key `file` to write, instead of the FILE argument (its public key goes to FILE.pub); never replaced")
}

func (c *releaseKeyCmd) run(_ context.Context, e *env, args []string) error {
	file := c.file
	switch {
	case len(args) == 1 && file != "":
		return usagef("give FILE or --file FILE, not both")
	case len(args) == 1:
		file = args[0]
	case file == "":
		return usagef("missing FILE: the private key file to write (or --file FILE)")
	}
	_, key, err := ed25519.GenerateKey(rand.Reader)
	if err != nil {
		return err
	}
	if err := writeReleaseKey(file, key); err != nil {
		return err
	}
	pub := key.Public().(ed25519.PublicKey)
	sum := sha256.Sum256(pub)
	fmt.Fprintf(e.stdout, "release key %s (sha256 %s): private key %s, public key %s\n",
		hex.EncodeToString(pub), hex.EncodeToString(sum[:8]), file, file+".pub")
	return nil
}

// writeReleaseKey writes key to path and its public key to path.pub,
// neither replacing an existing file (both are checked first, so a
// refusal leaves no half of a pair).
func writeReleaseKey(path string, key ed25519.PrivateKey) error {
	privPEM, pubPEM, err := keyPairPEM(key)
	if err != nil {
		return err
	}
	for _, p := range []string{path, path + ".pub"} {
		if _, err := os.Lstat(p); err == nil {
			return fmt.Errorf("%s exists: a release key is never replaced (pick another file)", p)
		} else if !errors.Is(err, os.ErrNotExist) {
			return err
		}
	}
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		return err
	}
	if err := writeNewFile(path, privPEM, 0o600); err != nil {
		return err
	}
	return writeNewFile(path+".pub", pubPEM, 0o644)
}

// writeNewFile writes a file that must not exist yet (O_EXCL: two runs at
// once cannot both write it).
func writeNewFile(path string, data []byte, mode os.FileMode) error {
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_CREATE|os.O_EXCL, mode)
	if err != nil {
		return err
	}
	if _, err := f.Write(data); err != nil {
		f.Close()
		os.Remove(path)
		return err
	}
	if err := f.Sync(); err != nil {
		f.Close()
		return err
	}
	return f.Close()
}

// readReleaseKey reads a release private key (PKCS#8 PEM, as
// plinthctl release key writes it; an owner key file has the same form).
func readReleaseKey(path string) (ed25519.PrivateKey, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	k, err := pki.ParsePrivateKeyPEM(b)
	if err != nil {
		return nil, fmt.Errorf("%s: %w (plinthctl release key FILE makes one)", path, err)
	}
	return k, nil
}
