package main

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"plinth.dev/plinth/roleserver/owner"
)

// TestOwnerKeyRotateAndEncrypt: plinthctl cluster owner-key --encrypt
// keeps the key encrypted (the next command needs the passphrase),
// --rotate replaces it with a new one the cluster certifies (the old one
// takes no certificate any more, and kubectl's cached certificate of it
// is dropped) and keeps it encrypted, --decrypt keeps it in the clear
// again.
func TestOwnerKeyRotateAndEncrypt(t *testing.T) {
	f := newFakeCluster(t)
	cfg := f.owned(t)
	t.Setenv(owner.PassphraseEnv, "s3cret passphrase")
	ctl(t, "cluster", "owner-key", "--config", cfg, "--encrypt")
	before, err := owner.LoadConfig(cfg)
	if err != nil || before.KeyPassphrase == nil {
		t.Fatalf("after --encrypt: %v", err)
	}
	t.Setenv(owner.PassphraseEnv, "")
	if _, stderr, code := runCLI("node", "list", "--config", cfg); code != 1 || !strings.Contains(stderr, owner.PassphraseEnv) {
		t.Errorf("a command without the passphrase: exit %d\n%s", code, stderr)
	}
	t.Setenv(owner.PassphraseEnv, "s3cret passphrase")
	cached := filepath.Join(cfg, kubeCredentialFile)
	if err := os.WriteFile(cached, []byte(`{"apiVersion":"client.authentication.k8s.io/v1","status":{}}`), 0o600); err != nil {
		t.Fatal(err)
	}
	out, _ := ctl(t, "cluster", "owner-key", "--config", cfg, "--rotate")
	if !strings.Contains(out, "owner key replaced") {
		t.Fatalf("--rotate:\n%s", out)
	}
	after, err := owner.LoadConfig(cfg)
	if err != nil || after.Key.Equal(before.Key) || after.KeyPassphrase == nil || !after.Credentials.PublicKey().Equal(after.Key.Public()) {
		t.Fatalf("after --rotate: %v", err)
	}
	ctl(t, "node", "list", "--config", cfg) // with the new key
	if _, err := os.Stat(cached); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("kubectl's cached certificate of the old key after --rotate: %v", err)
	}
	if _, _, err := owner.TakeOwnership(t.Context(), f.Addr, before.Key); err == nil {
		t.Error("the old key still takes an owner certificate")
	}
	ctl(t, "cluster", "owner-key", "--config", cfg, "--decrypt")
	t.Setenv(owner.PassphraseEnv, "")
	ctl(t, "node", "list", "--config", cfg) // in the clear
}

// TestOwnerKeyUsage: cluster owner-key takes exactly one of --rotate,
// --encrypt and --decrypt, no argument and no -o; anything else is wrong
// usage (exit 2) and leaves the key as it was.
func TestOwnerKeyUsage(t *testing.T) {
	f := newFakeCluster(t)
	cfg := f.owned(t)
	t.Setenv(owner.PassphraseEnv, "s3cret passphrase")
	before, err := os.ReadFile(filepath.Join(cfg, owner.KeyFile))
	if err != nil {
		t.Fatal(err)
	}
	for _, args := range [][]string{
		{"--rotate", "--encrypt"},
		{"--encrypt", "--decrypt"},
		{"--rotate", "--encrypt", "--decrypt"},
		{},
		{"--rotate", "extra"},
		{"--encrypt", "-o", "json"},
		{"-rotate"},
	} {
		_, stderr, code := runCLI(append([]string{"cluster", "owner-key", "--config", cfg}, args...)...)
		if code != 2 {
			t.Errorf("cluster owner-key %q: exit %d, want 2\n%s", args, code, stderr)
		}
	}
	if _, stderr, _ := runCLI("cluster", "owner-key", "--config", cfg, "--rotate", "--decrypt"); !strings.Contains(stderr, "exactly one of --rotate, --encrypt and --decrypt") {
		t.Errorf("two flags: the error does not say what to give:\n%s", stderr)
	}
	if after, _ := os.ReadFile(filepath.Join(cfg, owner.KeyFile)); string(after) != string(before) {
		t.Error("wrong usage changed the owner key")
	}
}

// TestSecretsKeyUsage: cluster secrets-key is a noun (status, rotate);
// --kube-server and --timeout are rotate's; a missing or unknown
// subcommand, an argument or a format neither prints is wrong usage
// (exit 2), before the cluster is asked anything.
func TestSecretsKeyUsage(t *testing.T) {
	f := newFakeCluster(t)
	cfg := f.owned(t)
	calls := f.OwnerCalls()
	for _, args := range [][]string{
		{},
		{"status", "extra"},
		{"stat"},
		{"status", "--timeout", "1m"},
		{"status", "-o", "table"},
		{"rotate", "--timeout", "soon"},
		{"rotate", "extra"},
	} {
		_, stderr, code := runCLI(append([]string{"cluster", "secrets-key", "--config", cfg}, args...)...)
		if code != 2 {
			t.Errorf("cluster secrets-key %q: exit %d, want 2\n%s", args, code, stderr)
		}
	}
	if n := f.OwnerCalls(); n != calls {
		t.Errorf("wrong usage made %d owner calls", n-calls)
	}
}

// TestOwnerKeyRotationResumed: the new key is on disk before any curator
// is asked; a rotation that reached none keeps it, and the next --rotate
// finishes with that key instead of making another.
func TestOwnerKeyRotationResumed(t *testing.T) {
	f := newFakeCluster(t)
	cfg := f.owned(t)
	before, err := owner.LoadConfig(cfg)
	if err != nil {
		t.Fatal(err)
	}
	_, stderr, code := runCLI("cluster", "owner-key", "--config", cfg, "--rotate", "--endpoint", "127.0.0.1:1")
	if code != 1 || !strings.Contains(stderr, owner.NextKeyFile) {
		t.Fatalf("--rotate with no curator answering: exit %d\n%s", code, stderr)
	}
	failed, err := owner.LoadConfig(cfg)
	if err != nil || !failed.Key.Equal(before.Key) {
		t.Fatalf("after the failed rotation the owner key changed (%v)", err)
	}
	pending, err := failed.NextKey()
	if err != nil || pending == nil {
		t.Fatalf("no next key kept: %v", err)
	}
	_, stderr = ctl(t, "cluster", "owner-key", "--config", cfg, "--rotate")
	if !strings.Contains(stderr, "resuming") {
		t.Errorf("the second --rotate does not say it resumes:\n%s", stderr)
	}
	after, err := owner.LoadConfig(cfg)
	if err != nil || !after.Key.Equal(pending) {
		t.Fatalf("after the resumed rotation the owner key is not the kept one (%v)", err)
	}
	if k, err := after.NextKey(); k != nil || err != nil {
		t.Errorf("the next key is still kept after the rotation: %v", err)
	}
	ctl(t, "node", "list", "--config", cfg)
}
