package main

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"plinth.dev/plinth/roleserver/owner"
)

// TestOwnerKeyRotateAndEncrypt: plinthctl owner-key -encrypt keeps the
// key encrypted (the next command needs the passphrase), -rotate
// replaces it with a new one the cluster certifies (the old one takes
// no certificate any more, and kubectl's cached certificate of it is
// dropped) and keeps it encrypted, -decrypt keeps it in
// the clear again; a command naming two is refused.
func TestOwnerKeyRotateAndEncrypt(t *testing.T) {
	f := newFakeCluster(t)
	cfg := f.owned(t)
	if _, _, err := runVerb("owner-key", "-config", cfg, "-rotate", "-encrypt"); err == nil {
		t.Error("-rotate -encrypt accepted")
	}
	t.Setenv(owner.PassphraseEnv, "s3cret passphrase")
	if _, stderr, err := runVerb("owner-key", "-config", cfg, "-encrypt"); err != nil {
		t.Fatalf("-encrypt: %v %s", err, stderr)
	}
	before, err := owner.LoadConfig(cfg)
	if err != nil || before.KeyPassphrase == nil {
		t.Fatalf("after -encrypt: %v", err)
	}
	t.Setenv(owner.PassphraseEnv, "")
	if _, _, err := runVerb("nodes", "list", "-config", cfg); err == nil || !strings.Contains(err.Error(), owner.PassphraseEnv) {
		t.Errorf("a command without the passphrase: %v", err)
	}
	t.Setenv(owner.PassphraseEnv, "s3cret passphrase")
	cached := filepath.Join(cfg, kubeCredentialFile)
	if err := os.WriteFile(cached, []byte(`{"apiVersion":"client.authentication.k8s.io/v1","status":{}}`), 0o600); err != nil {
		t.Fatal(err)
	}
	out, stderr, err := runVerb("owner-key", "-config", cfg, "-rotate")
	if err != nil || !strings.Contains(out, "owner key replaced") {
		t.Fatalf("-rotate: %v %s\n%s", err, stderr, out)
	}
	after, err := owner.LoadConfig(cfg)
	if err != nil || after.Key.Equal(before.Key) || after.KeyPassphrase == nil || !after.Credentials.PublicKey().Equal(after.Key.Public()) {
		t.Fatalf("after -rotate: %v", err)
	}
	if _, _, err := runVerb("nodes", "list", "-config", cfg); err != nil {
		t.Errorf("a command with the new key: %v", err)
	}
	if _, err := os.Stat(cached); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("kubectl's cached certificate of the old key after -rotate: %v", err)
	}
	if _, _, err := owner.TakeOwnership(t.Context(), f.Addr, before.Key); err == nil {
		t.Error("the old key still takes an owner certificate")
	}
	if _, _, err := runVerb("owner-key", "-config", cfg, "-decrypt"); err != nil {
		t.Fatal(err)
	}
	t.Setenv(owner.PassphraseEnv, "")
	if _, _, err := runVerb("nodes", "list", "-config", cfg); err != nil {
		t.Errorf("a command after -decrypt: %v", err)
	}
}
