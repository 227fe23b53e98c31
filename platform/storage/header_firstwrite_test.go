package storage

import (
	"bytes"
	"errors"
	"reflect"
	"testing"
)

// Tests of the very first header write and its intent marker (see the
// package doc): a cut first write reads as "setup never began", damage
// never does.

// TestDamagedHeaderIsNotBlank: a zero slot 0 next to a damaged slot 1 is
// damage (a zeroed sector range, a discard, a bad copy), not a first write
// cut short, which always leaves the intent marker in slot 0. It must be
// refused, never read as "no header" (which would format the partition).
func TestDamagedHeaderIsNotBlank(t *testing.T) {
	ready := testHeader()
	ready.State, ready.SealedKey = StateReady, seq(1, 2000)
	for name, c := range map[string]struct {
		damage func(s1 []byte)
		want   error
	}{
		"bit flip":          {func(s []byte) { s[100] ^= 4 }, ErrCorruptHeader},
		"magic sector only": {func(s []byte) { clear(s[512:]) }, ErrCorruptHeader},
		"tail zeroed":       {func(s []byte) { clear(s[1024:]) }, ErrCorruptHeader},
		"first sector lost": {func(s []byte) { clear(s[:512]) }, ErrNotPlinth},
		"garbage":           {func(s []byte) { copy(s, randomBytes(9, len(s))) }, ErrNotPlinth},
	} {
		m := region(t, ready)
		clear(m.b[:SlotSize])
		c.damage(m.b[SlotSize:])
		h, rep, err := ReadHeader(m, 0)
		if h != nil || rep.Used != -1 || !errors.Is(err, c.want) || errors.Is(err, ErrNoHeader) {
			t.Errorf("zero slot 0, slot 1 %s: %v, want %v and never ErrNoHeader", name, err, c.want)
		}
	}
}

// sectorWrite is one 512-byte sector of a recorded write.
type sectorWrite struct {
	off int64
	b   []byte
}

// recorder records WriteHeader's writes sector by sector, in order.
type recorder struct{ sectors []sectorWrite }

func (r *recorder) WriteAt(b []byte, off int64) (int, error) {
	for s := 0; s*512 < len(b); s++ {
		r.sectors = append(r.sectors, sectorWrite{off + int64(s)*512, b[s*512 : (s+1)*512]})
	}
	return len(b), nil
}

// TestFirstWriteCutPoints replays the first WriteHeader on a blank region
// one sector at a time and cuts after every sector: the region is blank,
// incomplete (setup never began) or holds the new header — never refused
// — and setup can start over from every cut.
func TestFirstWriteCutPoints(t *testing.T) {
	h := testHeader()
	h.SealedKey = seq(4, 3000)
	var rec recorder
	c := *h
	if err := WriteHeader(&rec, 0, &c); err != nil {
		t.Fatal(err)
	}
	if n := len(rec.sectors); n != 1+2*SlotSize/512 {
		t.Fatalf("%d sectors written, want the marker and two slots", n)
	}
	seen := map[string]int{}
	for k := 0; k <= len(rec.sectors); k++ {
		m := newMem(HeaderSize)
		for _, w := range rec.sectors[:k] {
			copy(m.b[w.off:], w.b)
		}
		got, rep, err := ReadHeader(m, 0)
		switch {
		case k == 0 && err == ErrNoHeader:
			seen["blank"]++
		case k > 0 && errors.Is(err, ErrHeaderIncomplete):
			seen["incomplete"]++
		case err == nil && reflect.DeepEqual(withoutSeq(got), withoutSeq(h)):
			seen["new"]++
			if k <= 1+SlotSize/512 && rep.Used != 1 || k == len(rec.sectors) && rep.Degraded() {
				t.Errorf("cut after %d sectors: %+v", k, rep)
			}
		default:
			t.Fatalf("cut after %d sectors: %+v %v", k, got, err)
		}
		// Once slot 1 is complete, the header is there for good.
		if k >= 1+SlotSize/512 && err != nil {
			t.Fatalf("cut after %d sectors, slot 1 complete: %v", k, err)
		}
		if err != nil {
			// The next boot sets up again, from sequence 0.
			again := *h
			if err := WriteHeader(m, 0, &again); err != nil {
				t.Fatal(err)
			}
			if got, rep, err := ReadHeader(m, 0); err != nil || rep.Degraded() || got.Sequence != 2 {
				t.Fatalf("setup after a cut at %d: %+v %+v %v", k, got, rep, err)
			}
		}
	}
	for _, w := range []string{"blank", "incomplete", "new"} {
		if seen[w] == 0 {
			t.Errorf("no cut gave %q (%v)", w, seen)
		}
	}
}

// TestFirstWriteThenDamage: after a real first write (marker gone) and
// after the update to Ready, losing either slot in any way loses nothing,
// and losing slot 0 to zeros plus any damage to slot 1 is refused.
//
// (A region whose both slots are all zero is blank by construction: that
// is what a partition looks like before its first write. The header here
// spans several sectors, so "first sector" damage leaves the rest.)
func TestFirstWriteThenDamage(t *testing.T) {
	init := testHeader()
	init.SealedKey = seq(6, 2000)
	ready := testHeader()
	ready.State, ready.SealedKey = StateReady, seq(7, 2000)
	damage := map[string]func([]byte){
		"zeroed":       func(s []byte) { clear(s) },
		"bit flip":     func(s []byte) { s[200] ^= 1 },
		"garbage":      func(s []byte) { copy(s, randomBytes(5, len(s))) },
		"first sector": func(s []byte) { clear(s[:512]) },
		"marker-like":  func(s []byte) { clear(s); copy(s, intentMagic) },
	}
	for _, stage := range []string{"initialising", "ready"} {
		base := newMem(HeaderSize)
		h := *init
		if err := WriteHeader(base, 0, &h); err != nil {
			t.Fatal(err)
		}
		want := init
		if stage == "ready" {
			r := *ready
			r.Sequence = h.Sequence
			if err := WriteHeader(base, 0, &r); err != nil {
				t.Fatal(err)
			}
			want = ready
		}
		if bytes.Contains(base.b, []byte(intentMagic)) {
			t.Fatalf("%s: the intent marker survived a complete write", stage)
		}
		for name, d := range damage {
			for slot := 0; slot < 2; slot++ {
				m := &mem{b: bytes.Clone(base.b)}
				d(m.b[slot*SlotSize : (slot+1)*SlotSize])
				got, rep, err := ReadHeader(m, 0)
				if err != nil || !reflect.DeepEqual(withoutSeq(got), withoutSeq(want)) || rep.Used != 1-slot || !rep.Degraded() {
					t.Errorf("%s, slot %d %s: %+v %+v %v", stage, slot, name, got, rep, err)
				}
			}
			// Slot 0 lost to zeros and slot 1 damaged too: refused, never blank.
			if name == "zeroed" {
				continue
			}
			m := &mem{b: bytes.Clone(base.b)}
			clear(m.b[:SlotSize])
			d(m.b[SlotSize:])
			if _, _, err := ReadHeader(m, 0); err == nil || errors.Is(err, ErrNoHeader) || !errorKindOK(err) {
				t.Errorf("%s, slot 0 zeroed and slot 1 %s: %v", stage, name, err)
			}
		}
	}
}

// TestIntentMarkerStates: what a marker next to each slot 1 means.
func TestIntentMarkerStates(t *testing.T) {
	h := testHeader()
	valid := region(t, h)
	marker := make([]byte, SlotSize)
	copy(marker, intentMagic)
	damagedMarker := bytes.Clone(marker)
	copy(damagedMarker[4096:], valid.b[4096:8192]) // header bytes behind the marker sector
	damagedMarker[5000] = 1
	corrupt := bytes.Clone(valid.b[SlotSize:])
	corrupt[100] ^= 1
	for name, c := range map[string]struct {
		s0, s1 []byte
		want   error // nil: slot 1's header
	}{
		"marker, zero":              {marker, make([]byte, SlotSize), ErrHeaderIncomplete},
		"marker, corrupt":           {marker, corrupt, ErrHeaderIncomplete},
		"marker, valid":             {marker, valid.b[SlotSize:], nil},
		"damaged marker, valid":     {damagedMarker, valid.b[SlotSize:], nil},
		"damaged marker, zero":      {damagedMarker, make([]byte, SlotSize), ErrCorruptHeader},
		"damaged marker, corrupt":   {damagedMarker, corrupt, ErrCorruptHeader},
		"marker in slot 1, zero s0": {make([]byte, SlotSize), marker, ErrNotPlinth},
	} {
		m := newMem(HeaderSize)
		copy(m.b, c.s0)
		copy(m.b[SlotSize:], c.s1)
		got, rep, err := ReadHeader(m, 0)
		if c.want == nil {
			if err != nil || rep.Used != 1 || !rep.Degraded() || got.Sequence != 1 {
				t.Errorf("%s: %+v %+v %v", name, got, rep, err)
			}
			continue
		}
		if !errors.Is(err, c.want) || (c.want != ErrHeaderIncomplete && errors.Is(err, ErrNoHeader)) {
			t.Errorf("%s: %v, want %v", name, err, c.want)
		}
	}
	// Only StateInitialising may start a blank region, so a cut first
	// write always means "setup never began".
	r := testHeader()
	r.State = StateReady
	m := newMem(HeaderSize)
	if err := WriteHeader(m, 0, r); err == nil || len(m.ops) != 0 {
		t.Errorf("ready header onto a blank region: %v, ops %v", err, m.ops)
	}
}
