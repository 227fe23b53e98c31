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
	"time"

	"plinth.dev/plinth/platform/bootdisk"
	"plinth.dev/plinth/platform/efivar"
	"plinth.dev/plinth/platform/gpt"
	"plinth.dev/plinth/platform/layout"
	"plinth.dev/plinth/platform/releasekeys"
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
// only if it is not older than the running release, unless a downgrade
// statement signed by one of the keys allows that very release and has
// not expired. Each refusal is ErrRejected with its Refusal.
func TestCheckRelease(t *testing.T) {
	pub, key := releaseKey(t)
	otherPub, otherKey := releaseKey(t)
	manifest := func(release uint64, signer ed25519.PublicKey) []byte {
		return fmt.Appendf(nil, `{"board":"qemu-x86_64","version":"v%d","release":%d,"release_key":%q}`, release, release, hex.EncodeToString(signer))
	}
	now := time.Unix(1_800_000_000, 0)
	down := func(release uint64, valid time.Duration, k ed25519.PrivateKey) *releasekeys.Signed {
		b, err := releasekeys.NewDowngrade(release, now.Add(-time.Minute), valid)
		if err != nil {
			t.Fatal(err)
		}
		s := releasekeys.Sign(b, k)
		return &s
	}
	tooLong := releasekeys.Sign(fmt.Appendf(nil, `{"kind":%q,"release":5,"expires":%d}`, releasekeys.KindDowngrade, now.Add(30*24*time.Hour).Unix()), key)
	notOne := releasekeys.Sign([]byte(`{"kind":"plinth.release-keys/v1","release":5,"expires":9999999999}`), key)
	// A downgrade statement's signature is not an image's, nor the other
	// way round.
	five := manifest(5, pub)
	asImage := releasekeys.Signed{Body: five, Signatures: []releasekeys.Signature{{Key: pub, Sig: ed25519.Sign(key, five)}}}
	seven := manifest(7, pub)
	tampered := []byte(strings.Replace(string(seven), `"v7"`, `"v8"`, 1))
	for _, c := range []struct {
		name      string
		manifest  []byte
		sig       []byte
		keys      [][]byte
		running   uint64
		downgrade *releasekeys.Signed
		want      Refusal // 0: accepted
		release   uint64
		says      string
	}{
		{"good", seven, ed25519.Sign(key, seven), [][]byte{pub}, 6, nil, 0, 7, ""},
		{"signed by the second of two keys (rotation)", seven, ed25519.Sign(key, seven), [][]byte{otherPub, pub}, 0, nil, 0, 7, ""},
		{"a malformed key is skipped, not fatal", seven, ed25519.Sign(key, seven), [][]byte{[]byte("short"), pub}, 0, nil, 0, 7, ""},
		{"equal release", seven, ed25519.Sign(key, seven), [][]byte{pub}, 7, nil, 0, 7, ""},
		{"unsigned", seven, nil, [][]byte{pub}, 0, nil, RefusedUnsigned, 0, "the image is not signed (no manifest.sig)"},
		{"another key signed it", seven, ed25519.Sign(otherKey, seven), [][]byte{pub}, 0, nil, RefusedSignature, 0,
			"the image's signature does not verify against any of the cluster's 1 release key (its manifest names release key " + hex.EncodeToString(pub) + ")"},
		{"another key, two in the cluster", seven, ed25519.Sign(otherKey, seven), [][]byte{pub, pub}, 0, nil, RefusedSignature, 0, "any of the cluster's 2 release keys"},
		{"one byte of the manifest changed", tampered, ed25519.Sign(key, seven), [][]byte{pub}, 0, nil, RefusedSignature, 0, "does not verify"},
		{"a truncated signature", seven, ed25519.Sign(key, seven)[:63], [][]byte{pub}, 0, nil, RefusedSignature, 0, "does not verify"},
		{"downgrade", five, ed25519.Sign(key, five), [][]byte{pub}, 7, nil, RefusedDowngrade, 0,
			"release 5 is older than the running release 7: no downgrade statement came with it"},
		{"downgrade allowed", five, ed25519.Sign(key, five), [][]byte{pub}, 7, down(5, time.Hour, key), 0, 5, ""},
		{"downgrade allowed, still signed", five, ed25519.Sign(otherKey, five), [][]byte{pub}, 7, down(5, time.Hour, key), RefusedSignature, 0, "does not verify"},
		{"downgrade statement by a key not the cluster's", five, ed25519.Sign(key, five), [][]byte{pub}, 7, down(5, time.Hour, otherKey), RefusedDowngrade, 0,
			"not signed by any of the cluster's release keys"},
		{"downgrade statement for another release", five, ed25519.Sign(key, five), [][]byte{pub}, 7, down(4, time.Hour, key), RefusedDowngrade, 0,
			"allows release 4, not 5"},
		{"an expired downgrade statement (replayed)", five, ed25519.Sign(key, five), [][]byte{pub}, 7, down(5, time.Second, key), RefusedDowngrade, 0, "expired"},
		{"a downgrade statement valid for a month", five, ed25519.Sign(key, five), [][]byte{pub}, 7, &tooLong, RefusedDowngrade, 0, "more than"},
		{"a key set as downgrade statement", five, ed25519.Sign(key, five), [][]byte{pub}, 7, &notOne, RefusedDowngrade, 0, "is not one"},
		{"the image's signature as downgrade statement", five, ed25519.Sign(key, five), [][]byte{pub}, 7, &asImage, RefusedDowngrade, 0, "is not one"},
		{"no keys", seven, ed25519.Sign(key, seven), nil, 0, nil, RefusedNoKeys, 0,
			"the cluster has no release keys: add one with plinthctl cluster policy --add-release-key"},
	} {
		t.Run(c.name, func(t *testing.T) {
			rel, err := CheckRelease(c.manifest, c.sig, c.keys, c.running, c.downgrade, now)
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
	if _, err := CheckRelease(garbage, ed25519.Sign(key, garbage), [][]byte{pub}, 0, nil, now); !errors.Is(err, ErrRejected) {
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
// a downgrade statement, and accepts the same release again.
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
		var down *releasekeys.Signed
		if allow {
			b, _ := releasekeys.NewDowngrade(release, time.Now(), time.Hour)
			s := releasekeys.Sign(b, key)
			down = &s
		}
		m := fmt.Appendf(nil, `{"board":"qemu-x86_64","version":"v%d","release":%d,"artefacts":{"system.img":{"sha256":"%s","size":4096},"plinth-b.efi":{"sha256":"%s","size":1000}}}`,
			release, release, strings.Repeat("ab", 32), strings.Repeat("cd", 32))
		return Request{Manifest: m, Signature: ed25519.Sign(key, m), ReleaseKeys: [][]byte{pub}, Downgrade: down}
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
