package owner

import (
	"bytes"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"plinth.dev/plinth/internal/testutil/fakecluster"
)

// TestOwnerKeyEncrypted: a configuration saved with a passphrase keeps
// owner.key encrypted (no PEM key in it), opens again with the
// passphrase, is refused with a wrong one or none (saying where to give
// it), and stays encrypted when saved again.
func TestOwnerKeyEncrypted(t *testing.T) {
	dir := t.TempDir()
	key := fakecluster.NewKey(t)
	cfg := &Config{Dir: dir, Key: key, KeyPassphrase: []byte("correct horse"), Curators: []string{"127.0.0.1:1"}, NodeEndpoints: map[string]string{}}
	if err := cfg.Save(); err != nil {
		t.Fatal(err)
	}
	raw, err := os.ReadFile(filepath.Join(dir, KeyFile))
	if err != nil || !bytes.HasPrefix(raw, []byte(armorHeader)) || bytes.Contains(raw, []byte("PRIVATE KEY")) {
		t.Fatalf("owner.key is not encrypted (%v):\n%s", err, raw)
	}
	t.Setenv(PassphraseEnv, "correct horse")
	got, err := LoadConfig(dir)
	if err != nil || !got.Key.Equal(key) || string(got.KeyPassphrase) != "correct horse" {
		t.Fatalf("loaded with the passphrase: %v", err)
	}
	if err := got.Save(); err != nil {
		t.Fatal(err)
	}
	if raw, _ := os.ReadFile(filepath.Join(dir, KeyFile)); !bytes.HasPrefix(raw, []byte(armorHeader)) {
		t.Error("saved again, owner.key is no longer encrypted")
	}
	t.Setenv(PassphraseEnv, "wrong")
	if _, err := LoadConfig(dir); err == nil || !strings.Contains(err.Error(), "passphrase") {
		t.Errorf("a wrong passphrase: %v", err)
	}
	t.Setenv(PassphraseEnv, "")
	if _, err := LoadConfig(dir); err == nil || !strings.Contains(err.Error(), PassphraseEnv) {
		t.Errorf("no passphrase: %v", err)
	}
}

// TestRotateOwnerKeyAndCRL: the client keeps the newest cluster CRL it
// received (a file of the configuration) and checks every handshake
// against it: a former member of the cluster, whose curator certificate
// the cluster revoked, is refused though it still answers with a
// certificate of the cluster CA. RotateOwnerKey signs the rotation with
// the new key and takes the new key's owner certificate.
func TestRotateOwnerKeyAndCRL(t *testing.T) {
	ca := fakecluster.NewCA(t, "cluster")
	key := fakecluster.NewKey(t)
	current := fakecluster.New(t, fakecluster.Config{CA: ca, OwnerKey: key})
	former := fakecluster.New(t, fakecluster.Config{CA: ca, OwnerKey: key})
	creds, _, err := TakeOwnership(ctx(t), current.Addr, key)
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	if err := (&Config{Dir: dir, Key: key, Credentials: creds, Curators: []string{former.Addr}, NodeEndpoints: map[string]string{}}).Save(); err != nil {
		t.Fatal(err)
	}
	call := func(curator string) error {
		t.Helper()
		cfg, err := LoadConfig(dir)
		if err != nil {
			t.Fatal(err)
		}
		cfg.Curators = []string{curator}
		c, err := Dial(cfg)
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		_, err = c.Nodes(ctx(t))
		return err
	}
	if err := call(former.Addr); err != nil {
		t.Fatalf("the member before its removal: %v", err)
	}
	crl, err := ca.Revoke(nil, former.Curator.SerialNumber)
	if err != nil {
		t.Fatal(err)
	}
	current.SetCRL(crl.Raw)
	if err := call(current.Addr); err != nil {
		t.Fatalf("a current member: %v", err)
	}
	if b, err := os.ReadFile(filepath.Join(dir, CRLFile)); err != nil || !bytes.Equal(b, crl.Raw) {
		t.Fatalf("the cluster CRL is not kept (%v)", err)
	}
	if err := call(former.Addr); err == nil || !strings.Contains(err.Error(), "revoked") {
		t.Fatalf("the former member, with the CRL held: %v; want its certificate refused as revoked", err)
	}

	cfg, err := LoadConfig(dir)
	if err != nil {
		t.Fatal(err)
	}
	cfg.Curators = []string{current.Addr}
	c, err := Dial(cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	next := fakecluster.NewKey(t)
	nc, resp, err := c.RotateOwnerKey(ctx(t), next, current.Addr)
	if err != nil || resp.GetRevoked() != 1 || !nc.PublicKey().Equal(next.Public()) || nc.Trust == nil {
		t.Fatalf("RotateOwnerKey: %v, %v", resp, err)
	}
	if _, _, err := TakeOwnership(ctx(t), current.Addr, key); err == nil {
		t.Error("the old key still takes an owner certificate")
	}
}
