package update

import (
	"crypto/ed25519"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"plinth.dev/plinth/platform/bootdisk"
	"plinth.dev/plinth/platform/efivar"
	"plinth.dev/plinth/platform/gpt"
	"plinth.dev/plinth/platform/layout"
)

func releaseKey(t *testing.T) (ed25519.PublicKey, ed25519.PrivateKey) {
	t.Helper()
	pub, key, err := ed25519.GenerateKey(rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	return pub, key
}

// TestCheckRelease: an image is installable only with a signature over
// its manifest's exact bytes by one of the cluster's release keys, and
// only if it is not older than the running release (unless the owner
// allows the downgrade). Each refusal is ErrRejected with its Refusal.
func TestCheckRelease(t *testing.T) {
	pub, key := releaseKey(t)
	otherPub, otherKey := releaseKey(t)
	manifest := func(release uint64, signer ed25519.PublicKey) []byte {
		return fmt.Appendf(nil, `{"board":"qemu-x86_64","version":"v%d","release":%d,"release_key":%q}`, release, release, hex.EncodeToString(signer))
	}
	seven := manifest(7, pub)
	tampered := []byte(strings.Replace(string(seven), `"v7"`, `"v8"`, 1))
	five := manifest(5, pub)
	for _, c := range []struct {
		name      string
		manifest  []byte
		sig       []byte
		keys      [][]byte
		running   uint64
		downgrade bool
		want      Refusal // 0: accepted
		release   uint64
		says      string
	}{
		{"good", seven, ed25519.Sign(key, seven), [][]byte{pub}, 6, false, 0, 7, ""},
		{"signed by the second of two keys (rotation)", seven, ed25519.Sign(key, seven), [][]byte{otherPub, pub}, 0, false, 0, 7, ""},
		{"a malformed key is skipped, not fatal", seven, ed25519.Sign(key, seven), [][]byte{[]byte("short"), pub}, 0, false, 0, 7, ""},
		{"equal release", seven, ed25519.Sign(key, seven), [][]byte{pub}, 7, false, 0, 7, ""},
		{"unsigned", seven, nil, [][]byte{pub}, 0, false, RefusedUnsigned, 0, "the image is not signed (no manifest.sig)"},
		{"another key signed it", seven, ed25519.Sign(otherKey, seven), [][]byte{pub}, 0, false, RefusedSignature, 0,
			"the image's signature does not verify against any of the cluster's 1 release key (its manifest names release key " + hex.EncodeToString(pub) + ")"},
		{"another key, two in the cluster", seven, ed25519.Sign(otherKey, seven), [][]byte{pub, pub}, 0, false, RefusedSignature, 0, "any of the cluster's 2 release keys"},
		{"one byte of the manifest changed", tampered, ed25519.Sign(key, seven), [][]byte{pub}, 0, false, RefusedSignature, 0, "does not verify"},
		{"a truncated signature", seven, ed25519.Sign(key, seven)[:63], [][]byte{pub}, 0, false, RefusedSignature, 0, "does not verify"},
		{"downgrade", five, ed25519.Sign(key, five), [][]byte{pub}, 7, false, RefusedDowngrade, 0,
			"release 5 is older than the running release 7 (plinthctl update -allow-downgrade to install it anyway)"},
		{"downgrade allowed", five, ed25519.Sign(key, five), [][]byte{pub}, 7, true, 0, 5, ""},
		{"downgrade allowed, still signed", five, ed25519.Sign(otherKey, five), [][]byte{pub}, 7, true, RefusedSignature, 0, "does not verify"},
		{"no keys", seven, ed25519.Sign(key, seven), nil, 0, false, RefusedNoKeys, 0,
			"the cluster has no release keys: add one with plinthctl policy -add-release-key"},
	} {
		t.Run(c.name, func(t *testing.T) {
			rel, err := CheckRelease(c.manifest, c.sig, c.keys, c.running, c.downgrade)
			if c.want == 0 {
				if err != nil || rel != c.release {
					t.Fatalf("release %d, %v; want %d accepted", rel, err, c.release)
				}
				return
			}
			var re *ReleaseError
			if !errors.Is(err, ErrRejected) || !errors.As(err, &re) || re.Refusal != c.want || !strings.Contains(err.Error(), c.says) {
				t.Fatalf("%v, want ErrRejected, refusal %d, saying %q", err, c.want, c.says)
			}
		})
	}
	// A signed manifest that does not parse is refused, not read as 0.
	garbage := []byte("{")
	if _, err := CheckRelease(garbage, ed25519.Sign(key, garbage), [][]byte{pub}, 0, false); !errors.Is(err, ErrRejected) {
		t.Errorf("signed garbage: %v", err)
	}
}

// TestParseOSRelease: the running release is PLINTH_RELEASE, 0 without
// one; a value that is not a number is an error, not release 0.
func TestParseOSRelease(t *testing.T) {
	r, err := ParseOSRelease([]byte("NAME=Plinth\nVERSION_ID=abc123\nPLINTH_BOARD=qemu-x86_64\nPLINTH_RELEASE=\"42\"\n"))
	if err != nil || r.Release != 42 || r.Version != "abc123" {
		t.Errorf("%+v, %v", r, err)
	}
	if r, err := ParseOSRelease([]byte("VERSION_ID=old\n")); err != nil || r.Release != 0 {
		t.Errorf("without PLINTH_RELEASE: %+v, %v", r, err)
	}
	if _, err := ParseOSRelease([]byte("PLINTH_RELEASE=seven\n")); err == nil {
		t.Error("PLINTH_RELEASE=seven accepted")
	}
}

// TestBeginRefusesDowngrade: Begin reads the running release from the
// node's os-release and refuses an older signed image before the slot is
// touched (nothing is recorded: the state stays empty), installs it with
// AllowDowngrade, and accepts the same release again.
func TestBeginRefusesDowngrade(t *testing.T) {
	slotB := gpt.Partition{Number: 3, Name: layout.SystemSlotNamePrefix + "b", Type: gpt.MustParseGUID(layout.SystemSlotType), FirstLBA: 788480, LastLBA: 1312767}
	osRelease := filepath.Join(t.TempDir(), "os-release")
	if err := os.WriteFile(osRelease, []byte("VERSION_ID=x\nPLINTH_RELEASE=7\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	store := efivar.Store{Dir: t.TempDir()}
	n := &Node{Boot: &bootdisk.Boot{Disk: "/dev/vda", Table: gpt.NewTable(gpt.GUID{1}, testESP, slotB), ESP: testESP}, Running: "a",
		Board: "qemu-x86_64", Store: store, Log: slog.New(slog.DiscardHandler), OSRelease: osRelease}
	pub, key := releaseKey(t)
	req := func(release uint64, allow bool) Request {
		m := fmt.Appendf(nil, `{"board":"qemu-x86_64","version":"v%d","release":%d,"artefacts":{"system.img":{"sha256":"%s","size":4096},"plinth-b.efi":{"sha256":"%s","size":1000}}}`,
			release, release, strings.Repeat("ab", 32), strings.Repeat("cd", 32))
		return Request{Manifest: m, Signature: ed25519.Sign(key, m), ReleaseKeys: [][]byte{pub}, AllowDowngrade: allow}
	}
	var re *ReleaseError
	if _, err := n.Begin(req(6, false)); !errors.As(err, &re) || re.Refusal != RefusedDowngrade || re.Running != 7 {
		t.Fatalf("release 6 on release 7: %v", err)
	}
	if st, err := Read(store); err != nil || st.Pending != nil || st.LastFailed != nil {
		t.Fatalf("a refused downgrade left state %+v (%v)", st, err)
	}
	for _, r := range []Request{req(6, true), req(7, false), req(8, false)} {
		s, err := n.Begin(r)
		if err != nil {
			t.Fatalf("%s: %v", r.Manifest, err)
		}
		s.Close()
	}
	if err := os.WriteFile(osRelease, []byte("PLINTH_RELEASE=x7\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if _, err := n.Begin(req(8, false)); err == nil {
		t.Error("an unreadable running release let an update begin")
	}
}
