package main

import (
	"errors"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"plinth.dev/plinth/platform/pki"
	"plinth.dev/plinth/roleserver/owner"
)

// takeownership prints the cluster CA's fingerprint, and with
// -ca-fingerprint refuses any other CA before saving anything.
func TestTakeOwnershipFingerprint(t *testing.T) {
	f := newFakeCluster(t)
	fp := pki.Fingerprint(f.CA.Certificate)

	// A malformed fingerprint is refused before the cluster is contacted.
	dir := f.ownerDir(t)
	_, _, err := runVerb("takeownership", "-config", dir, "-endpoint", f.Addr, "-ca-fingerprint", "AB:CD")
	if !errors.Is(err, pki.ErrBadFingerprint) || f.EscrowCount() != 0 {
		t.Errorf("malformed -ca-fingerprint: %v, %d escrows", err, f.EscrowCount())
	}

	// Another CA's fingerprint: refused, and the configuration still holds
	// the owner key alone.
	other, err := pki.NewCA("Plinth cluster CA", 0)
	if err != nil {
		t.Fatal(err)
	}
	_, _, err = runVerb("takeownership", "-config", dir, "-endpoint", f.Addr, "-ca-fingerprint", pki.Fingerprint(other.Certificate))
	if !errors.Is(err, owner.ErrCAFingerprintMismatch) {
		t.Fatalf("another CA's fingerprint: %v, want ErrCAFingerprintMismatch", err)
	}
	if got := files(t, dir); got != owner.EndpointsFile+" "+owner.KeyFile {
		t.Errorf("after the refusal the configuration holds %q, want the key (and empty endpoints) only", got)
	}

	// The right one (as openssl prints it, lowercase here): owned, and the
	// fingerprint is printed.
	_, stderr, err := runVerb("takeownership", "-config", dir, "-endpoint", f.Addr, "-ca-fingerprint", "sha256 Fingerprint="+strings.ToLower(fp))
	if err != nil {
		t.Fatalf("matching fingerprint: %v\n%s", err, stderr)
	}
	if !strings.Contains(stderr, fp) || strings.Contains(stderr, "trusted on first use") {
		t.Errorf("stderr does not report the pinned fingerprint %s:\n%s", fp, stderr)
	}
	cfg, err := owner.LoadConfig(dir)
	if err != nil || cfg.Credentials == nil || !cfg.Credentials.CA.Equal(f.CA.Certificate) {
		t.Fatalf("saved configuration: %+v, %v", cfg, err)
	}

	// Without the flag: trust on first use, with the fingerprint to check.
	dir2 := f.ownerDir(t)
	_, stderr, err = runVerb("takeownership", "-config", dir2, "-endpoint", f.Addr)
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(stderr, fp) || !strings.Contains(stderr, "trusted on first use") {
		t.Errorf("stderr without -ca-fingerprint:\n%s", stderr)
	}
	if _, err := owner.LoadConfig(filepath.Clean(dir2)); err != nil {
		t.Error(err)
	}
}

// TestTakeOwnershipWaitsForCurator: takeownership pasted while the node
// still boots (its forwarded port resets every connection, then nothing
// listens) keeps trying and succeeds once the curator answers; -wait
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
	_, stderr, err := runVerb("takeownership", "-config", dir, "-endpoint", ep, "-wait", "1m")
	if err != nil || !strings.Contains(stderr, "does not answer yet") || !strings.Contains(stderr, "you own the cluster") {
		t.Fatalf("takeownership while the curator comes up: %v\n%s", err, stderr)
	}
	start := time.Now()
	if _, _, err := runVerb("takeownership", "-config", f.ownerDir(t), "-endpoint", resetter(t), "-wait", "3s"); status.Code(err) != codes.Unavailable || time.Since(start) < 3*time.Second {
		t.Errorf("takeownership -wait 3s against a port that resets: %v after %v", err, time.Since(start))
	}
}
