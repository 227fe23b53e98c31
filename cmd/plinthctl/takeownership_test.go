package main

import (
	"path/filepath"
	"strings"
	"testing"
	"time"

	"plinth.dev/plinth/platform/pki"
	"plinth.dev/plinth/roleserver/owner"
)

// cluster takeownership prints the cluster CA's fingerprint, and with
// --ca-fingerprint refuses any other CA before saving anything.
func TestTakeOwnershipFingerprint(t *testing.T) {
	f := newFakeCluster(t)
	fp := pki.Fingerprint(f.CA.Certificate)
	take := func(dir string, args ...string) (string, string, int) {
		return runCLI(append([]string{"cluster", "takeownership", "--config", dir, "--endpoint", f.Addr}, args...)...)
	}

	// A malformed fingerprint is wrong usage, refused before the cluster
	// is contacted.
	dir := f.ownerDir(t)
	_, stderr, code := take(dir, "--ca-fingerprint", "AB:CD")
	if code != 2 || !strings.Contains(stderr, pki.ErrBadFingerprint.Error()) || f.EscrowCount() != 0 {
		t.Errorf("malformed --ca-fingerprint: exit %d, %d escrows\n%s", code, f.EscrowCount(), stderr)
	}

	// Another CA's fingerprint: refused, and the configuration still holds
	// the owner key alone.
	other, err := pki.NewCA("Plinth cluster CA", 0)
	if err != nil {
		t.Fatal(err)
	}
	_, stderr, code = take(dir, "--ca-fingerprint", pki.Fingerprint(other.Certificate))
	if code != 1 || !strings.Contains(stderr, owner.ErrCAFingerprintMismatch.Error()) {
		t.Fatalf("another CA's fingerprint: exit %d, want 1 and ErrCAFingerprintMismatch\n%s", code, stderr)
	}
	if got := files(t, dir); got != owner.EndpointsFile+" "+owner.KeyFile {
		t.Errorf("after the refusal the configuration holds %q, want the key (and empty endpoints) only", got)
	}

	// The right one (as openssl prints it, lowercase here): owned, and the
	// fingerprint is printed.
	_, stderr = ctl(t, "cluster", "takeownership", "--config", dir, "--endpoint", f.Addr, "--ca-fingerprint", "sha256 Fingerprint="+strings.ToLower(fp))
	if !strings.Contains(stderr, fp) || strings.Contains(stderr, "trusted on first use") {
		t.Errorf("stderr does not report the pinned fingerprint %s:\n%s", fp, stderr)
	}
	cfg, err := owner.LoadConfig(dir)
	if err != nil || cfg.Credentials == nil || !cfg.Credentials.CA.Equal(f.CA.Certificate) {
		t.Fatalf("saved configuration: %+v, %v", cfg, err)
	}
	// Taken: again only with --force.
	if _, stderr, code := take(dir); code != 1 || !strings.Contains(stderr, "--force") {
		t.Errorf("takeownership into an owned configuration: exit %d\n%s", code, stderr)
	}

	// Without the flag: trust on first use, with the fingerprint to check.
	dir2 := f.ownerDir(t)
	_, stderr = ctl(t, "cluster", "takeownership", "--config", dir2, "--endpoint", f.Addr)
	if !strings.Contains(stderr, fp) || !strings.Contains(stderr, "trusted on first use") {
		t.Errorf("stderr without --ca-fingerprint:\n%s", stderr)
	}
	if _, err := owner.LoadConfig(filepath.Clean(dir2)); err != nil {
		t.Error(err)
	}
}

// TestTakeOwnershipUsage: the bootstrap curator is the global --endpoint,
// required here (there is no configuration to find curators in yet);
// without it, or with a malformed --mgmt-endpoint or an argument, the
// usage is wrong (exit 2) and nothing is contacted.
func TestTakeOwnershipUsage(t *testing.T) {
	f := newFakeCluster(t)
	dir := f.ownerDir(t)
	for _, args := range [][]string{
		{"cluster", "takeownership", "--config", dir},
		{"cluster", "takeownership", "--config", dir, "--endpoint", f.Addr, "--mgmt-endpoint", "no-port"},
		{"cluster", "takeownership", "--config", dir, "--endpoint", f.Addr, "extra"},
		{"cluster", "takeownership", "--config", dir, "--endpoint", f.Addr, "-o", "json"},
	} {
		if _, stderr, code := runCLI(args...); code != 2 {
			t.Errorf("plinthctl %s: exit %d, want 2\n%s", strings.Join(args, " "), code, stderr)
		}
	}
	if _, stderr, _ := runCLI("cluster", "takeownership", "--config", dir); !strings.Contains(stderr, "--endpoint HOST:PORT") {
		t.Errorf("without --endpoint the error does not name it:\n%s", stderr)
	}
	if f.EscrowCount() != 0 {
		t.Errorf("%d escrows after wrong usage", f.EscrowCount())
	}
}

// TestTakeOwnershipWaitsForCurator: takeownership pasted while the node
// still boots (its forwarded port resets every connection, then nothing
// listens) keeps trying and succeeds once the curator answers; --wait
// bounds it.
func TestTakeOwnershipWaitsForCurator(t *testing.T) {
	f := newFakeCluster(t)
	dir := f.ownerDir(t)
	ep := closedPort(t)
	time.AfterFunc(3*time.Second, func() {
		if _, err := listenOn(t, ep, proxyTo(f.Addr)); err != nil {
			t.Error(err)
		}
	})
	_, stderr := ctl(t, "cluster", "takeownership", "--config", dir, "--endpoint", ep, "--wait", "1m")
	if !strings.Contains(stderr, "does not answer yet") || !strings.Contains(stderr, "you own the cluster") {
		t.Fatalf("takeownership while the curator comes up:\n%s", stderr)
	}
	start := time.Now()
	_, stderr, code := runCLI("cluster", "takeownership", "--config", f.ownerDir(t), "--endpoint", resetter(t), "--wait", "3s")
	if code != 1 || !strings.Contains(stderr, "code = Unavailable") || time.Since(start) < 3*time.Second {
		t.Errorf("takeownership --wait 3s against a port that resets: exit %d after %v\n%s", code, time.Since(start), stderr)
	}
}
