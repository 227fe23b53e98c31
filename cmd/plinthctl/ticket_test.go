package main

import (
	"bytes"
	"encoding/base64"
	"encoding/json"
	"strings"
	"testing"
)

// cluster ticket prints the register ticket; --rotate replaces it,
// prints the new one and says what that means.
func TestTicketRotate(t *testing.T) {
	f := newFakeCluster(t)
	dir := f.owned(t)

	out, _ := ctl(t, "cluster", "ticket", "--config", dir)
	if want := base64.StdEncoding.EncodeToString([]byte("first ticket")) + "\n"; out != want {
		t.Fatalf("ticket: %q; want %q", out, want)
	}

	out, stderr := ctl(t, "cluster", "ticket", "--config", dir, "--rotate")
	rotated, err := base64.StdEncoding.DecodeString(strings.TrimSpace(out))
	if err != nil || len(rotated) != 32 {
		t.Fatalf("ticket --rotate printed %q: %v", out, err)
	}
	for _, want := range []string{"old ticket stops working", "already registered are not affected", "plinthctl params --register"} {
		if !strings.Contains(stderr, want) {
			t.Errorf("ticket --rotate does not say %q:\n%s", want, stderr)
		}
	}
	if now, _ := ctl(t, "cluster", "ticket", "--config", dir, "--raw"); !bytes.Equal([]byte(now), rotated) {
		t.Errorf("ticket after rotation %x; want %x", now, rotated)
	}

	// --raw --rotate writes the new bytes as they are.
	out, _ = ctl(t, "cluster", "ticket", "--config", dir, "--rotate", "--raw")
	if len(out) != 32 || bytes.Equal([]byte(out), rotated) {
		t.Errorf("ticket --rotate --raw: %x", out)
	}
}

// TestTicketOutput: -o json is {"ticket": base64} of the ticket the text
// prints, yaml the same; --raw with either is wrong usage (exit 2) and
// rotates nothing.
func TestTicketOutput(t *testing.T) {
	f := newFakeCluster(t)
	dir := f.owned(t)
	text, _ := ctl(t, "cluster", "ticket", "--config", dir)
	out, _ := ctl(t, "cluster", "ticket", "--config", dir, "-o", "json")
	var got struct{ Ticket string }
	if err := json.Unmarshal([]byte(out), &got); err != nil || got.Ticket != strings.TrimSpace(text) {
		t.Errorf("ticket -o json: %q, %v; want the ticket %q", out, err, text)
	}
	if out, _ := ctl(t, "cluster", "ticket", "--config", dir, "-o", "yaml"); out != "ticket: "+text {
		t.Errorf("ticket -o yaml: %q", out)
	}
	for _, args := range [][]string{
		{"--raw", "-o", "json"},
		{"--rotate", "--raw", "-o", "yaml"},
		{"-o", "table"},
		{"extra"},
	} {
		if _, stderr, code := runCLI(append([]string{"cluster", "ticket", "--config", dir}, args...)...); code != 2 {
			t.Errorf("cluster ticket %q: exit %d, want 2\n%s", args, code, stderr)
		}
	}
	if now, _ := ctl(t, "cluster", "ticket", "--config", dir); now != text {
		t.Errorf("wrong usage changed the ticket: %q, was %q", now, text)
	}
}
