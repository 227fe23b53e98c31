package main

import (
	"bytes"
	"encoding/base64"
	"strings"
	"testing"
)

// ticket prints the register ticket; ticket -rotate replaces it, prints
// the new one and says what that means.
func TestTicketRotate(t *testing.T) {
	f := newFakeCluster(t)
	dir := f.owned(t)

	out, _, err := runVerb("ticket", "-config", dir)
	if want := base64.StdEncoding.EncodeToString([]byte("first ticket")) + "\n"; err != nil || out != want {
		t.Fatalf("ticket: %q, %v; want %q", out, err, want)
	}

	out, stderr, err := runVerb("ticket", "-config", dir, "-rotate")
	if err != nil {
		t.Fatal(err)
	}
	rotated, err := base64.StdEncoding.DecodeString(strings.TrimSpace(out))
	if err != nil || len(rotated) != 32 {
		t.Fatalf("ticket -rotate printed %q: %v", out, err)
	}
	for _, want := range []string{"old ticket stops working", "already registered are not affected", "plinthctl params -register"} {
		if !strings.Contains(stderr, want) {
			t.Errorf("ticket -rotate does not say %q:\n%s", want, stderr)
		}
	}
	if now, _, err := runVerb("ticket", "-config", dir, "-raw"); err != nil || !bytes.Equal([]byte(now), rotated) {
		t.Errorf("ticket after rotation %x, %v; want %x", now, err, rotated)
	}

	// -raw -rotate writes the new bytes as they are.
	out, _, err = runVerb("ticket", "-config", dir, "-rotate", "-raw")
	if err != nil || len(out) != 32 || bytes.Equal([]byte(out), rotated) {
		t.Errorf("ticket -rotate -raw: %x, %v", out, err)
	}
}
