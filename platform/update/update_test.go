package update

import (
	"bytes"
	"context"
	"crypto/ed25519"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"log/slog"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"plinth.dev/plinth/platform/bootdisk"
	"plinth.dev/plinth/platform/efivar"
	"plinth.dev/plinth/platform/gpt"
	"plinth.dev/plinth/platform/layout"
)

var now = time.Unix(1700000000, 0)

// TestSettle: the node's side of an update at every point a reset can
// come: what the boot is and what is stored.
func TestSettle(t *testing.T) {
	writing := &Pending{Phase: PhaseWriting, From: "a", To: "b", Version: "v2"}
	ready := &Pending{Phase: PhaseReady, From: "a", To: "b", Version: "v2"}
	staged := &Pending{Phase: PhaseStaged, From: "a", To: "b", Version: "v2"}
	old := &Failure{Version: "v0", Reason: "earlier"}
	for _, c := range []struct {
		name       string
		st         State
		running    string
		boot       Boot
		wantFailed string // substring of the recorded reason, "" for none
	}{
		{"no update", State{LastVersion: "v1"}, "a", BootNormal, ""},
		{"earlier failure kept", State{LastFailed: old}, "a", BootNormal, ""},
		{"reset while slot b was written", State{Pending: writing}, "a", BootRolledBack, "interrupted while slot b was written"},
		{"first boot of b after BootNext", State{Pending: ready}, "b", BootTrial, ""},
		{"reboot while b is staged keeps it staged", State{Pending: staged, LastFailed: old}, "a", BootNormal, ""},
		{"staged b booted through an old entry", State{Pending: staged}, "b", BootTrial, ""},
		{"reset on b before it confirmed (crash, hang, halt, no unseal)", State{Pending: ready}, "a", BootRolledBack, "did not confirm"},
		{"ready but booted elsewhere (network boot)", State{Pending: ready}, "", BootRolledBack, `this boot runs ""`},
	} {
		t.Run(c.name, func(t *testing.T) {
			st, boot := Settle(c.st, c.running, now)
			if boot != c.boot {
				t.Fatalf("boot %v, want %v", boot, c.boot)
			}
			switch {
			case c.boot != BootRolledBack && st.Pending != c.st.Pending:
				t.Error("the pending update changed")
			case c.boot == BootRolledBack && st.Pending != nil:
				t.Error("a rolled-back boot kept the pending update")
			}
			if c.wantFailed == "" && st.LastFailed != c.st.LastFailed {
				t.Errorf("failure %+v recorded", st.LastFailed)
			}
			if c.wantFailed != "" && (st.LastFailed == nil || !strings.Contains(st.LastFailed.Reason, c.wantFailed) || st.LastFailed.Time != now.Unix()) {
				t.Errorf("failure %+v, want one saying %q", st.LastFailed, c.wantFailed)
			}
		})
	}
	confirmed := Confirm(State{Pending: ready, LastFailed: old})
	if confirmed.Pending != nil || confirmed.LastVersion != "v2" || confirmed.LastFailed != old {
		t.Errorf("confirmed state %+v", confirmed)
	}
}

// TestStateVariable: the state round-trips through the variable; a
// missing variable is no update; a corrupt or impossible one is reported
// (the boot treats it as no update and replaces it); an empty state
// deletes the variable.
func TestStateVariable(t *testing.T) {
	s := efivar.Store{Dir: t.TempDir()}
	if st, err := Read(s); err != nil || st != (State{}) {
		t.Fatalf("no variable: %+v, %v", st, err)
	}
	want := State{Pending: &Pending{Phase: PhaseReady, From: "a", To: "b", Version: "v2", Started: 7}}
	if err := Write(s, want); err != nil {
		t.Fatal(err)
	}
	got, err := Read(s)
	if err != nil || *got.Pending != *want.Pending {
		t.Fatalf("round trip: %+v, %v", got, err)
	}
	attrs, _, err := s.Read(VarName, VendorGUID)
	if err != nil || attrs != efivar.NonVolatile|efivar.BootServiceAccess|efivar.RuntimeAccess {
		t.Fatalf("attributes %#x, %v", attrs, err)
	}
	for _, bad := range []string{`{`, `{"pending":{"phase":"ready","from":"a","to":"a"}}`, `{"pending":{"phase":"odd","from":"a","to":"b"}}`, `{"pending":{"phase":"ready","from":"x","to":"b"}}`} {
		if err := s.Write(VarName, VendorGUID, varAttributes, []byte(bad)); err != nil {
			t.Fatal(err)
		}
		if _, err := Read(s); !errors.Is(err, ErrCorruptState) {
			t.Errorf("%s: %v, want ErrCorruptState", bad, err)
		}
	}
	n := &Node{Running: "a", Store: s, Log: slog.New(slog.DiscardHandler)}
	if boot, _, err := n.Start(now); err != nil || boot != BootNormal {
		t.Fatalf("start on a corrupt variable: %v, %v", boot, err)
	}
	if _, err := os.Stat(filepath.Join(s.Dir, VarName+"-"+VendorGUID)); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("the corrupt variable was not replaced: %v", err)
	}
}

// testESP is an ESP as the disk image has it.
var testESP = gpt.Partition{Number: 1, FirstLBA: 2048, LastLBA: 264191, ID: gpt.MustParseGUID("726B5290-E42A-42ED-A7A1-40B6B97FF2BD")}

// TestEntries: the slots' boot entries are created once and reused, the
// firmware's own entries are kept, BootNext names the new slot, and
// making a slot the default puts it first and the other slot out.
func TestEntries(t *testing.T) {
	s := efivar.Store{Dir: t.TempDir()}
	fw := efivar.LoadOption{Attributes: efivar.LoadOptionActive, Description: "UEFI QEMU HARDDISK", FilePath: []byte{0x7f, 0xff, 4, 0}}
	if err := s.SetBootEntry(0, fw); err != nil {
		t.Fatal(err)
	}
	if err := s.SetBootOrder([]uint16{0}); err != nil {
		t.Fatal(err)
	}
	e := Entries{Store: s, ESP: testESP}
	b, err := e.BootOnce("b")
	if err != nil {
		t.Fatal(err)
	}
	if next, err := s.BootNext(); err != nil || next != b || b == 0 {
		t.Fatalf("BootNext %d (%v), entry %d", next, err, b)
	}
	entries, _ := s.BootEntries()
	hd, file, ok := efivar.ParseBootPath(entries[b].FilePath)
	if !ok || file != `\EFI\plinth\b.efi` || gpt.GUID(hd.GUID) != testESP.ID || hd.StartLBA != 2048 || entries[b].Description != "Plinth b" {
		t.Fatalf("entry %d: %+v %q", b, hd, file)
	}
	if again, err := e.Ensure("b"); err != nil || again != b {
		t.Fatalf("Ensure made a second entry %d (%v)", again, err)
	}
	a, err := e.Ensure("a")
	if err != nil || a == b {
		t.Fatalf("entry a %d, %v", a, err)
	}
	if err := s.SetBootOrder([]uint16{a, 0}); err != nil {
		t.Fatal(err)
	}
	if err := e.MakeDefault("b"); err != nil {
		t.Fatal(err)
	}
	if order, _ := s.BootOrder(); !slices.Equal(order, []uint16{b, 0}) {
		t.Fatalf("BootOrder %v, want [%d 0]", order, b)
	}
	if err := e.CancelBootOnce("a"); err != nil {
		t.Fatal(err)
	}
	if _, err := s.BootNext(); err != nil {
		t.Fatal("BootNext for b cleared by cancelling a")
	}
	if err := e.CancelBootOnce("b"); err != nil {
		t.Fatal(err)
	}
	if _, err := s.BootNext(); !errors.Is(err, efivar.ErrNotFound) {
		t.Fatalf("BootNext after cancelling b: %v", err)
	}
}

// TestBegin: an update is refused before anything is written for a
// network-booted node, a malformed manifest or one for another board, a
// slot too small, and while another update runs or waits for its trial.
func TestBegin(t *testing.T) {
	slotB := gpt.Partition{Number: 3, Name: layout.SystemSlotNamePrefix + "b", Type: gpt.MustParseGUID(layout.SystemSlotType), FirstLBA: 788480, LastLBA: 1312767}
	boot := &bootdisk.Boot{Disk: "/dev/vda", Table: gpt.NewTable(gpt.GUID{1}, testESP, slotB), ESP: testESP}
	manifest := func(board string, sys int64) []byte {
		m := map[string]any{"board": board, "version": "v2", "artefacts": map[string]any{
			"system.img":   map[string]any{"sha256": strings.Repeat("ab", 32), "size": sys},
			"plinth-b.efi": map[string]any{"sha256": strings.Repeat("cd", 32), "size": 1000},
		}}
		b, _ := json.Marshal(m)
		return b
	}
	n := &Node{Boot: boot, Running: "a", Board: "qemu-x86_64", Store: efivar.Store{Dir: t.TempDir()}, Log: slog.New(slog.DiscardHandler),
		OSRelease: filepath.Join(t.TempDir(), "no-os-release")}
	pub, key, _ := ed25519.GenerateKey(rand.Reader)
	signed := func(m []byte) Request {
		return Request{Manifest: m, Signature: ed25519.Sign(key, m), ReleaseKeys: [][]byte{pub}}
	}
	for _, c := range []struct {
		name string
		node *Node
		req  Request
		want error
	}{
		{"network boot", &Node{Log: n.Log}, signed(manifest("qemu-x86_64", 1)), ErrNoSlots},
		{"garbage", n, signed([]byte("{")), ErrRejected},
		{"unsigned", n, Request{Manifest: manifest("qemu-x86_64", 1), ReleaseKeys: [][]byte{pub}}, ErrRejected},
		{"other board", n, signed(manifest("generic-x86_64", 1)), ErrRejected},
		{"too large for the slot", n, signed(manifest("qemu-x86_64", slotB.Size()+1)), ErrRejected},
	} {
		if _, err := c.node.Begin(c.req); !errors.Is(err, c.want) {
			t.Errorf("%s: %v, want %v", c.name, err, c.want)
		}
	}
	s, err := n.Begin(signed(manifest("qemu-x86_64", 1<<20)))
	if err != nil {
		t.Fatal(err)
	}
	if s.Slot() != "b" || !slices.Equal(s.Artefacts(), []string{"system.img", "plinth-b.efi"}) {
		t.Errorf("session writes %s from %v", s.Slot(), s.Artefacts())
	}
	if _, err := n.Begin(signed(manifest("qemu-x86_64", 1<<20))); !errors.Is(err, ErrBusy) {
		t.Errorf("second update at once: %v", err)
	}
	s.Close()
	if err := n.setState(State{Pending: &Pending{Phase: PhaseReady, From: "a", To: "b", Version: "v2"}}); err != nil {
		t.Fatal(err)
	}
	if _, err := n.Begin(signed(manifest("qemu-x86_64", 1<<20))); !errors.Is(err, ErrBusy) {
		t.Errorf("update while another waits for its trial: %v", err)
	}
}

// TestOther: while an update is pending the keys seal to the other
// slot's PCRs, as the data volume keeps them: the new slot's on the old,
// the old slot's on the trial. Without the file (the volume not open),
// with one of another update or a malformed one, there are none; once
// nothing is pending, the file is gone.
func TestOther(t *testing.T) {
	dir := t.TempDir()
	file := filepath.Join(dir, "update-pcrs")
	p := &Pending{Phase: PhaseReady, From: "a", To: "b", Version: "v2", Started: 7}
	node := func(running string, boot Boot) *Node {
		return &Node{Running: running, boot: boot, state: State{Pending: p}, PCRSets: file, Store: efivar.Store{Dir: dir}, Log: slog.New(slog.DiscardHandler)}
	}
	onA, onB := node("a", BootNormal), node("b", BootTrial)
	if v := onA.Other(); v != nil {
		t.Errorf("no file: %x", v)
	}
	if err := onA.keepPCRs(p, map[string]map[int][]byte{"a": {15: {0xaa}}, "b": {15: {0xbb}}}); err != nil {
		t.Fatal(err)
	}
	if v := onA.Other(); len(v) != 1 || v[15][0] != 0xbb {
		t.Errorf("on a: %x", v)
	}
	if v := onB.Other(); len(v) != 1 || v[15][0] != 0xaa {
		t.Errorf("on the trial of b: %x", v)
	}
	other := *p
	other.Started = 8
	if v := (&Node{Running: "a", state: State{Pending: &other}, PCRSets: file, Log: onA.Log}).Other(); v != nil {
		t.Errorf("a file of another update: %x", v)
	}
	if err := os.WriteFile(file, []byte(`{"from":"a","to":"b","version":"v2","started":7,"pcrs":{"b":{"15":"zz"}}}`), 0o600); err != nil {
		t.Fatal(err)
	}
	if v := onA.Other(); v != nil {
		t.Errorf("a malformed file: %x", v)
	}
	if v := (&Node{Running: "a"}).Other(); v != nil {
		t.Errorf("no update: %x", v)
	}
	if err := onA.setState(State{}); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(file); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("the PCR values outlive the pending update: %v", err)
	}
}

// TestInstallRefusesBadStreams: a stream that ends early, carries more
// than the manifest's artefacts or does not hash to it fails the update
// before any boot entry names the slot: the state records the failure,
// nothing is pending, BootNext is not set. (The slot is a file here;
// the running slot is never the target: Begin picks the other one.)
func TestInstallRefusesBadStreams(t *testing.T) {
	sys := bytes.Repeat([]byte("system image "), 1000)
	ukiData := []byte("not really a UKI")
	sum := func(b []byte) string { s := sha256.Sum256(b); return hex.EncodeToString(s[:]) }
	manifest, _ := json.Marshal(map[string]any{"board": "qemu-x86_64", "version": "v2", "artefacts": map[string]any{
		"system.img":   map[string]any{"sha256": sum(sys), "size": len(sys)},
		"plinth-b.efi": map[string]any{"sha256": sum(ukiData), "size": len(ukiData)},
	}})
	flip := func(b []byte, i int) []byte { c := bytes.Clone(b); c[i] ^= 1; return c }
	for _, c := range []struct {
		name   string
		stream []byte
		want   string
	}{
		{"ends inside the system image", sys[:len(sys)/2], "the stream ended after"},
		{"system image corrupted", append(flip(sys, 100), ukiData...), "the system image does not match the manifest's sha256"},
		{"ends inside the UKI", append(bytes.Clone(sys), ukiData[:3]...), "the stream ended inside plinth-b.efi"},
		{"UKI corrupted", append(bytes.Clone(sys), flip(ukiData, 0)...), "plinth-b.efi does not match the manifest's sha256"},
		{"more than the manifest", append(append(bytes.Clone(sys), ukiData...), 'x'), "more than the manifest's artefacts"},
		{"UKI that is not one", append(bytes.Clone(sys), ukiData...), "plinth-b.efi:"},
	} {
		t.Run(c.name, func(t *testing.T) {
			store := efivar.Store{Dir: t.TempDir()}
			slot := filepath.Join(t.TempDir(), "slot-b")
			if err := os.WriteFile(slot, nil, 0o600); err != nil {
				t.Fatal(err)
			}
			n := &Node{Boot: &bootdisk.Boot{Disk: "/dev/vda", ESP: testESP}, Running: "a", Board: "qemu-x86_64", Store: store, Log: slog.New(slog.DiscardHandler)}
			s := &Session{n: n, slot: "b", dev: slot, size: 1 << 20}
			if err := json.Unmarshal(manifest, &s.m); err != nil {
				t.Fatal(err)
			}
			var err error
			if s.sys, err = s.m.artefact("system.img"); err != nil {
				t.Fatal(err)
			}
			if s.uki, err = s.m.artefact("plinth-b.efi"); err != nil {
				t.Fatal(err)
			}
			err = s.Install(context.Background(), bytes.NewReader(c.stream), nil)
			if !errors.Is(err, ErrRejected) || !strings.Contains(err.Error(), c.want) {
				t.Fatalf("%v, want ErrRejected saying %q", err, c.want)
			}
			st, rerr := Read(store)
			if rerr != nil || st.Pending != nil || st.LastFailed == nil || st.LastFailed.Version != "v2" || st.LastFailed.Slot != "b" {
				t.Fatalf("state after the refusal: %+v (%v)", st, rerr)
			}
			if _, err := store.BootNext(); !errors.Is(err, efivar.ErrNotFound) {
				t.Fatalf("BootNext set after a refused update: %v", err)
			}
		})
	}
}

// TestActivateCancel: a staged update boots only once activated (BootNext
// names its entry, the state says ready); cancelling a staged or ready
// update clears BootNext and the state, keeps the last failure and
// reseals; neither works on the trial boot, for another version, or
// with nothing installed.
func TestActivateCancel(t *testing.T) {
	store := efivar.Store{Dir: t.TempDir()}
	reseals := 0
	n := &Node{Boot: &bootdisk.Boot{Disk: "/dev/vda", ESP: testESP}, Running: "a", Board: "qemu-x86_64", Store: store,
		Log: slog.New(slog.DiscardHandler), Reseal: func() error { reseals++; return nil }}
	old := &Failure{Version: "v0", Reason: "earlier"}
	stage := func() {
		t.Helper()
		if err := n.setState(State{Pending: &Pending{Phase: PhaseStaged, From: "a", To: "b", Version: "v2"}, LastFailed: old}); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := n.Activate(""); !errors.Is(err, ErrNotStaged) {
		t.Fatalf("activate with nothing staged: %v", err)
	}
	stage()
	if _, err := store.BootNext(); !errors.Is(err, efivar.ErrNotFound) {
		t.Fatalf("BootNext set by a staged update: %v", err)
	}
	if _, err := n.Activate("v3"); !errors.Is(err, ErrNotStaged) {
		t.Fatalf("activate another version: %v", err)
	}
	p, err := n.Activate("v2")
	if err != nil || p.Phase != PhaseReady || p.To != "b" {
		t.Fatalf("activate: %+v, %v", p, err)
	}
	next, err := store.BootNext()
	if err != nil {
		t.Fatalf("BootNext after activating: %v", err)
	}
	entries, err := store.BootEntries()
	if err != nil {
		t.Fatal(err)
	}
	if entry, ok := (Entries{Store: store, ESP: testESP}).find(entries, "b"); !ok || entry != next {
		t.Fatalf("BootNext %d, slot b's entry %d (%v)", next, entry, ok)
	}
	if st, err := Read(store); err != nil || st.Pending == nil || st.Pending.Phase != PhaseReady {
		t.Fatalf("state after activating: %+v, %v", st, err)
	}
	cancel := func(what string) {
		t.Helper()
		before := reseals
		if _, err := n.Cancel("v2"); err != nil {
			t.Fatalf("cancel the %s update: %v", what, err)
		}
		st, err := Read(store)
		if err != nil || st.Pending != nil || st.LastFailed == nil || st.LastFailed.Reason != old.Reason || reseals != before+1 {
			t.Fatalf("after cancelling the %s update: %+v, %v, %d reseals", what, st, err, reseals-before)
		}
		if _, err := store.BootNext(); !errors.Is(err, efivar.ErrNotFound) {
			t.Fatalf("BootNext after cancelling the %s update: %v", what, err)
		}
	}
	cancel("ready")
	stage()
	cancel("staged")
	if _, err := n.Cancel(""); !errors.Is(err, ErrNotStaged) {
		t.Fatalf("cancel twice: %v", err)
	}
	trial := &Node{Boot: n.Boot, Running: "b", Store: store, Log: n.Log, boot: BootTrial,
		state: State{Pending: &Pending{Phase: PhaseReady, From: "a", To: "b", Version: "v2"}}}
	if _, err := trial.Cancel(""); !errors.Is(err, ErrBusy) {
		t.Fatalf("cancel on the trial boot: %v", err)
	}
	if _, err := (&Node{}).Activate(""); !errors.Is(err, ErrNoSlots) {
		t.Fatalf("activate on a network boot: %v", err)
	}
}
