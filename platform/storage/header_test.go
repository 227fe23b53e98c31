package storage

import (
	"bytes"
	"crypto/sha256"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"reflect"
	"strings"
	"testing"

	"plinth.dev/plinth/platform/gpt"
)

var testPartition = gpt.MustParseGUID("8A5DD5C2-3C5F-4E0E-9C3B-1B2D3E4F5A6B")

func testHeader() *Header {
	return &Header{
		Version:     HeaderVersion,
		State:       StateInitialising,
		Mode:        ModeCrypt,
		Filesystem:  FilesystemXFS,
		PartitionID: testPartition,
		SealedKey:   seq(7, 300),
		KeyPolicy:   KeyPolicyTPM,
		Created:     1767225600,
	}
}

// mem is an in-memory device. Its ops log records writes and syncs.
type mem struct {
	b   []byte
	ops []string
}

func newMem(n int) *mem { return &mem{b: make([]byte, n)} }

func (m *mem) ReadAt(b []byte, off int64) (int, error) {
	if off >= int64(len(m.b)) {
		return 0, io.EOF
	}
	n := copy(b, m.b[off:])
	if n < len(b) {
		return n, io.EOF
	}
	return n, nil
}

func (m *mem) WriteAt(b []byte, off int64) (int, error) {
	m.ops = append(m.ops, fmt.Sprintf("write %d+%d", off, len(b)))
	return copy(m.b[off:], b), nil
}

func (m *mem) Sync() error {
	m.ops = append(m.ops, "sync")
	return nil
}

// randomBytes returns n reproducible pseudo-random bytes.
func randomBytes(seed byte, n int) []byte {
	b := make([]byte, n)
	rand.NewChaCha8([32]byte{seed}).Read(b)
	return b
}

// withoutSeq compares headers regardless of Sequence.
func withoutSeq(h *Header) Header {
	c := *h
	c.Sequence = 0
	return c
}

func TestHeaderRoundTrip(t *testing.T) {
	big := testHeader()
	big.SealedKey = seq(1, maxBody-(8+1+1+8+16+1+3+1+3+2))
	for name, h := range map[string]*Header{
		"typical": testHeader(),
		"no key":  {Version: 1, State: StateReady, Mode: ModeAuthenticated, Filesystem: FilesystemExt4, PartitionID: testPartition, KeyPolicy: KeyPolicyInsecureNoTPM, Sequence: 7},
		"largest": big,
	} {
		b, err := h.Encode()
		if err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		if len(b) != SlotSize || !bytes.HasPrefix(b, []byte("PLINTHDATA\x00\x01")) {
			t.Fatalf("%s: %d bytes, prefix %q", name, len(b), b[:12])
		}
		got, err := DecodeHeader(b)
		if err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		if !reflect.DeepEqual(got, h) {
			t.Errorf("%s:\n got %+v\nwant %+v", name, got, h)
		}
	}
	big.SealedKey = append(big.SealedKey, 0)
	if _, err := big.Encode(); !errors.Is(err, ErrHeaderTooLarge) {
		t.Errorf("oversize sealed key: %v", err)
	}
}

func TestEncodeRejects(t *testing.T) {
	for name, mod := range map[string]func(*Header){
		"version 0":        func(h *Header) { h.Version = 0 },
		"version 2":        func(h *Header) { h.Version = 2 },
		"state 0":          func(h *Header) { h.State = 0 },
		"state 3":          func(h *Header) { h.State = 3 },
		"mode 0":           func(h *Header) { h.Mode = 0 },
		"mode 3":           func(h *Header) { h.Mode = 3 },
		"filesystem":       func(h *Header) { h.Filesystem = "btrfs" },
		"no filesystem":    func(h *Header) { h.Filesystem = "" },
		"zero partition":   func(h *Header) { h.PartitionID = gpt.GUID{} },
		"no policy":        func(h *Header) { h.KeyPolicy = "" },
		"long policy":      func(h *Header) { h.KeyPolicy = strings.Repeat("p", 65) },
		"policy space":     func(h *Header) { h.KeyPolicy = "tpm x" },
		"policy newline":   func(h *Header) { h.KeyPolicy = "tpm\n" },
		"policy non-ascii": func(h *Header) { h.KeyPolicy = "tpm\xff" },
		"huge key":         func(h *Header) { h.SealedKey = make([]byte, 70000) },
	} {
		h := testHeader()
		mod(h)
		if b, err := h.Encode(); err == nil {
			t.Errorf("%s: accepted", name)
		} else if b != nil {
			t.Errorf("%s: returned bytes with the error", name)
		}
		m := newMem(HeaderSize)
		if err := WriteHeader(m, 0, h); err == nil || len(m.ops) != 0 || !allZero(m.b) {
			t.Errorf("%s: WriteHeader %v, ops %v", name, err, m.ops)
		}
	}
}

// slotWithBody builds a slot with a correct checksum around any body, so
// tests can reach the checks behind the checksum.
func slotWithBody(version uint16, body []byte) []byte {
	b := make([]byte, SlotSize)
	copy(b, magic)
	binary.LittleEndian.PutUint16(b[12:], version)
	binary.LittleEndian.PutUint32(b[14:], uint32(len(body)))
	copy(b[prefixLen:], body)
	sum := sha256.Sum256(b[:prefixLen+len(body)])
	copy(b[prefixLen+len(body):], sum[:])
	return b
}

// bodyOf returns the body of an encoded slot.
func bodyOf(b []byte) []byte {
	n := binary.LittleEndian.Uint32(b[14:])
	return append([]byte(nil), b[prefixLen:prefixLen+int(n)]...)
}

func TestDecodeErrors(t *testing.T) {
	good, err := testHeader().Encode()
	if err != nil {
		t.Fatal(err)
	}
	body := bodyOf(good)
	random := randomBytes(1, SlotSize)
	foreign := make([]byte, SlotSize)
	copy(foreign[1024:], "\x53\xef") // an ext4 magic somewhere: not ours
	wrongMagic := bytes.Clone(good)
	copy(wrongMagic, "PLINTHDATA\x00\x02")
	v2 := slotWithBody(2, body)
	padded := bytes.Clone(good)
	padded[SlotSize-1] = 1

	// Fields of the body: sequence 0..7, state 8, mode 9, created 10..17,
	// partition 18..33, fs length 34, fs 35..37 ("xfs"), policy length 38.
	withField := func(off int, v ...byte) []byte {
		b := bytes.Clone(body)
		copy(b[off:], v)
		return slotWithBody(1, b)
	}
	for name, c := range map[string]struct {
		b    []byte
		want error
	}{
		"all zero":          {make([]byte, SlotSize), ErrNoHeader},
		"empty":             {nil, ErrNoHeader},
		"short zeros":       {make([]byte, 100), ErrNoHeader},
		"random":            {random, ErrNotPlinth},
		"foreign":           {foreign, ErrNotPlinth},
		"wrong magic":       {wrongMagic, ErrNotPlinth},
		"magic prefix only": {[]byte("PLINTH"), ErrCorruptHeader},
		"truncated":         {good[:SlotSize-1], ErrCorruptHeader},
		"truncated to body": {good[:100], ErrCorruptHeader},
		"magic only":        {good[:12], ErrCorruptHeader},
		"too long":          {append(bytes.Clone(good), 0), ErrCorruptHeader},
		"version 2":         {v2, ErrUnsupportedVersion},
		"version 0":         {slotWithBody(0, body), ErrUnsupportedVersion},
		"padding":           {padded, ErrCorruptHeader},
		"trailing bytes":    {slotWithBody(1, append(bytes.Clone(body), 0)), ErrCorruptHeader},
		"cut body":          {slotWithBody(1, body[:len(body)-1]), ErrCorruptHeader},
		"empty body":        {slotWithBody(1, nil), ErrCorruptHeader},
		"bad state":         {withField(8, 9), ErrCorruptHeader},
		"bad mode":          {withField(9, 0), ErrCorruptHeader},
		"zero partition":    {withField(18, make([]byte, 16)...), ErrCorruptHeader},
		"fs length overrun": {withField(34, 0xff), ErrCorruptHeader},
		"bad fs":            {withField(35, 'z'), ErrCorruptHeader},
		"policy overrun":    {withField(38, 0xff), ErrCorruptHeader},
		"body length huge": {func() []byte {
			b := bytes.Clone(good)
			binary.LittleEndian.PutUint32(b[14:], SlotSize)
			return b
		}(), ErrCorruptHeader},
	} {
		h, err := DecodeHeader(c.b)
		if h != nil || !errors.Is(err, c.want) {
			t.Errorf("%s: %v, want %v", name, err, c.want)
		}
		// The three outcomes never blur into each other.
		kinds := 0
		for _, k := range []error{ErrNoHeader, ErrNotPlinth, ErrCorruptHeader} {
			if errors.Is(err, k) {
				kinds++
			}
		}
		if kinds != 1 {
			t.Errorf("%s: %v matches %d error kinds", name, err, kinds)
		}
	}
	if !errors.Is(ErrUnsupportedVersion, ErrCorruptHeader) {
		t.Error("ErrUnsupportedVersion is not an ErrCorruptHeader")
	}
}

// TestDecodeBitFlips flips every bit of an encoded header, field by field:
// a flip in the magic makes it foreign, anywhere else corrupt.
func TestDecodeBitFlips(t *testing.T) {
	h := testHeader()
	h.SealedKey = seq(0, 40)
	good, err := h.Encode()
	if err != nil {
		t.Fatal(err)
	}
	end := prefixLen + len(bodyOf(good)) + checksumLen
	region := func(i int) string {
		switch {
		case i < 12:
			return "magic"
		case i < 14:
			return "version"
		case i < 18:
			return "body length"
		case i < end-checksumLen:
			return "body"
		case i < end:
			return "checksum"
		}
		return "padding"
	}
	positions := []int{}
	for i := 0; i < end+16; i++ {
		positions = append(positions, i)
	}
	positions = append(positions, SlotSize/2, SlotSize-1)
	for _, i := range positions {
		for bit := 0; bit < 8; bit++ {
			b := bytes.Clone(good)
			b[i] ^= 1 << bit
			want := ErrCorruptHeader
			if region(i) == "magic" {
				want = ErrNotPlinth
			}
			if _, err := DecodeHeader(b); !errors.Is(err, want) || errors.Is(err, ErrUnsupportedVersion) {
				t.Errorf("flip byte %d bit %d (%s): %v, want %v", i, bit, region(i), err, want)
			}
		}
	}
}

func TestReadWriteHeader(t *testing.T) {
	const off = 1 << 20
	m := newMem(4 << 20)
	if _, _, err := ReadHeader(m, off); !errors.Is(err, ErrNoHeader) || errors.Is(err, ErrHeaderIncomplete) {
		t.Fatalf("blank: %v", err)
	}
	h := testHeader()
	if err := WriteHeader(m, off, h); err != nil {
		t.Fatal(err)
	}
	want := []string{fmt.Sprintf("write %d+%d", off, intentSize), "sync",
		fmt.Sprintf("write %d+%d", off+SlotSize, SlotSize), "sync", fmt.Sprintf("write %d+%d", off, SlotSize), "sync"}
	if !reflect.DeepEqual(m.ops, want) {
		t.Errorf("ops %v, want %v (intent marker, flush, slot 1, flush, slot 0, flush)", m.ops, want)
	}
	if h.Sequence != 2 {
		t.Errorf("sequence after first write: %d", h.Sequence)
	}
	got, rep, err := ReadHeader(m, off)
	if err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(got, h) || rep.Used != 0 || rep.Degraded() || rep.Slots[1].Sequence != 1 {
		t.Errorf("got %+v, report %+v", got, rep)
	}
	// Update: Ready, new sealed key; no marker this time.
	got.State, got.SealedKey = StateReady, seq(9, 10)
	m.ops = nil
	if err := WriteHeader(m, off, got); err != nil {
		t.Fatal(err)
	}
	if want := []string{fmt.Sprintf("write %d+%d", off+SlotSize, SlotSize), "sync", fmt.Sprintf("write %d+%d", off, SlotSize), "sync"}; !reflect.DeepEqual(m.ops, want) {
		t.Errorf("update ops %v, want %v", m.ops, want)
	}
	again, rep, err := ReadHeader(m, off)
	if err != nil || again.State != StateReady || again.Sequence != 4 || rep.Degraded() {
		t.Errorf("after update: %+v %+v %v", again, rep, err)
	}
	// Nothing outside the region was touched.
	if !allZero(m.b[:off]) || !allZero(m.b[off+HeaderSize:]) {
		t.Error("WriteHeader wrote outside its region")
	}
	// A short device is an I/O error, not a header state.
	if _, _, err := ReadHeader(m, int64(len(m.b))-100); err == nil || errors.Is(err, ErrNoHeader) || errors.Is(err, ErrCorruptHeader) || errors.Is(err, ErrNotPlinth) {
		t.Errorf("short read: %v", err)
	}
}

// region returns a header region as complete WriteHeaders of hs leave
// it: both slots hold the last header, with sequences 2n-1 (slot 1) and
// 2n (slot 0). It encodes the slots itself, so that a test can start from
// any header (WriteHeader writes only StateInitialising to a blank region).
func region(t testing.TB, hs ...*Header) *mem {
	t.Helper()
	m := newMem(HeaderSize)
	if len(hs) == 0 {
		return m
	}
	n := uint64(len(hs))
	for slot, seq := range [2]uint64{2 * n, 2*n - 1} {
		c := *hs[len(hs)-1]
		c.Sequence = seq
		b, err := c.Encode()
		if err != nil {
			t.Fatal(err)
		}
		copy(m.b[slot*SlotSize:], b)
	}
	return m
}

// TestSlotDamage: after a complete write, losing either slot in any way
// loses nothing, and no older state (Initialising) can come back.
func TestSlotDamage(t *testing.T) {
	init := testHeader()
	ready := testHeader()
	ready.State = StateReady
	damage := map[string]func([]byte){
		"bit flip": func(s []byte) { s[100] ^= 4 },
		"zeroed":   func(s []byte) { clear(s) },
		"garbage":  func(s []byte) { copy(s, randomBytes(3, len(s))) },
		"magic":    func(s []byte) { s[0] = 'X' },
	}
	for name, d := range damage {
		for slot := 0; slot < 2; slot++ {
			m := region(t, init, ready)
			d(m.b[slot*SlotSize : (slot+1)*SlotSize])
			got, rep, err := ReadHeader(m, 0)
			if err != nil || got.State != StateReady || !rep.Degraded() || rep.Used != 1-slot {
				t.Errorf("%s in slot %d: %+v %+v %v", name, slot, got, rep, err)
				continue
			}
			// Rewriting repairs.
			if err := WriteHeader(m, 0, got); err != nil {
				t.Fatal(err)
			}
			if _, rep, err := ReadHeader(m, 0); err != nil || rep.Degraded() {
				t.Errorf("%s in slot %d: after repair %+v %v", name, slot, rep, err)
			}
		}
	}
	// Both slots damaged: an error, never blank.
	for name, want := range map[string]error{"bit flip": ErrCorruptHeader, "garbage": ErrNotPlinth, "magic": ErrNotPlinth} {
		m := region(t, ready)
		damage[name](m.b[:SlotSize])
		damage[name](m.b[SlotSize:])
		if _, rep, err := ReadHeader(m, 0); !errors.Is(err, want) || errors.Is(err, ErrNoHeader) || rep.Used != -1 {
			t.Errorf("both slots %s: %v, want %v", name, err, want)
		}
	}
	// A corrupt slot next to a foreign one is still corrupt.
	m := region(t, ready)
	m.b[100] ^= 1
	m.b[SlotSize] = 'X'
	if _, _, err := ReadHeader(m, 0); !errors.Is(err, ErrCorruptHeader) {
		t.Errorf("corrupt + foreign: %v", err)
	}
}

func TestSlotParity(t *testing.T) {
	m := region(t, testHeader())
	// Swapped slots: each copy is in the wrong slot.
	s0 := bytes.Clone(m.b[:SlotSize])
	copy(m.b[:SlotSize], m.b[SlotSize:])
	copy(m.b[SlotSize:], s0)
	if _, _, err := ReadHeader(m, 0); !errors.Is(err, ErrCorruptHeader) || !strings.Contains(err.Error(), "does not belong") {
		t.Errorf("swapped slots: %v", err)
	}
	// Slot 0 copied over slot 1: slot 0 still good.
	m = region(t, testHeader())
	copy(m.b[SlotSize:], m.b[:SlotSize])
	if h, rep, err := ReadHeader(m, 0); err != nil || rep.Used != 0 || !rep.Degraded() || h.Sequence != 2 {
		t.Errorf("duplicated slot 0: %+v %+v %v", h, rep, err)
	}
}

func TestUnsupportedVersionWins(t *testing.T) {
	m := region(t, testHeader())
	good := m.b[SlotSize:]
	copy(good, slotWithBody(2, bodyOf(good)))
	if _, _, err := ReadHeader(m, 0); !errors.Is(err, ErrUnsupportedVersion) {
		t.Errorf("newer version next to a valid slot: %v", err)
	}
}

// cutDevice applies a WriteHeader as a power cut would: calls before cut
// complete, call number cut writes only the sectors in keep, later calls
// never happen.
type cutDevice struct {
	mem
	call, cut int
	keep      func(sector int) bool
}

var errCut = errors.New("power cut")

func (c *cutDevice) WriteAt(b []byte, off int64) (int, error) {
	defer func() { c.call++ }()
	switch {
	case c.call < c.cut:
		return c.mem.WriteAt(b, off)
	case c.call > c.cut:
		return 0, errCut
	}
	for s := 0; s*512 < len(b); s++ {
		if c.keep(s) {
			copy(c.mem.b[off+int64(s)*512:], b[s*512:(s+1)*512])
		}
	}
	return 0, errCut
}

// TestTornWrites cuts WriteHeader in every write (intent marker, slot
// writes) with many subsets of sectors reaching the disk (disks may
// reorder sectors of one write): the result is always the old or the new
// header, never an error — except that a cut first write may also leave
// "no header" (blank, or ErrHeaderIncomplete) behind.
func TestTornWrites(t *testing.T) {
	initBig := testHeader()
	initBig.SealedKey = seq(1, 3000) // spans several sectors
	ready := testHeader()
	ready.State, ready.SealedKey = StateReady, seq(2, 700)
	resealed := testHeader()
	resealed.State, resealed.SealedKey = StateReady, seq(3, 1500)

	type step struct {
		name     string
		old, new *Header // old nil: blank region
	}
	rng := rand.New(rand.NewPCG(5, 6))
	subsets := []func(int) bool{
		func(int) bool { return false },
		func(int) bool { return true },
	}
	for k := 0; k <= SlotSize/512; k++ {
		subsets = append(subsets,
			func(s int) bool { return s < k },  // a prefix reached the disk
			func(s int) bool { return s >= k }, // a suffix reached the disk
			func(s int) bool { return s != k }, // all but one sector
		)
	}
	for i := 0; i < 100; i++ {
		mask := rng.Uint64()
		subsets = append(subsets, func(s int) bool { return mask>>(s%64)&1 == 1 })
	}
	for _, st := range []step{
		{"first write", nil, initBig},
		{"initialising to ready", initBig, ready},
		{"reseal", ready, resealed},
		{"shrink key", resealed, ready},
	} {
		seen := map[string]int{}
		// The write whose completion makes the new header safe: the first
		// slot write (the second write, after the marker, on a blank region).
		last := 1
		if st.old == nil {
			last = 2
		}
		for cut := 0; cut <= last; cut++ {
			for si, keep := range subsets {
				var base *mem
				var oldSeq uint64
				if st.old != nil {
					base = region(t, st.old)
					oldSeq = 2
				} else {
					base = newMem(HeaderSize)
				}
				d := &cutDevice{mem: mem{b: bytes.Clone(base.b)}, cut: cut, keep: keep}
				nh := *st.new
				nh.Sequence = oldSeq
				if err := WriteHeader(d, 0, &nh); !errors.Is(err, errCut) {
					t.Fatalf("%s: WriteHeader: %v", st.name, err)
				}
				got, _, err := ReadHeader(&d.mem, 0)
				where := fmt.Sprintf("%s, cut in write %d, subset %d", st.name, cut, si)
				switch {
				case err != nil && st.old == nil && cut < last && errors.Is(err, ErrHeaderIncomplete):
					seen["incomplete"]++ // interrupted first write: never initialised
				case err != nil && st.old == nil && cut == 0 && errors.Is(err, ErrNoHeader):
					seen["blank"]++ // the marker did not reach the disk
				case err != nil:
					t.Fatalf("%s: %v", where, err)
				case reflect.DeepEqual(withoutSeq(got), withoutSeq(st.new)):
					seen["new"]++
				case cut < last && st.old != nil && reflect.DeepEqual(withoutSeq(got), withoutSeq(st.old)):
					seen["old"]++
				default:
					t.Fatalf("%s: got %+v", where, got)
				}
				if cut == last && !reflect.DeepEqual(withoutSeq(got), withoutSeq(st.new)) {
					t.Fatalf("%s: the first slot write was complete, yet got %+v", where, got)
				}
			}
		}
		// The subsets must have produced every outcome the step allows,
		// or the test proves less than it claims.
		want := []string{"old", "new"}
		if st.old == nil {
			want = []string{"incomplete", "blank", "new"}
		}
		for _, w := range want {
			if seen[w] == 0 {
				t.Errorf("%s: no cut gave outcome %q (%v)", st.name, w, seen)
			}
		}
	}
}

// TestInterruptedFirstWrite: the intent marker in slot 0 and a fragment
// (or nothing) in slot 1 is what a cut first write leaves: incomplete.
func TestInterruptedFirstWrite(t *testing.T) {
	h := testHeader()
	h.SealedKey = seq(1, 2000) // so the header spans several sectors
	b, err := h.Encode()
	if err != nil {
		t.Fatal(err)
	}
	for name, frag := range map[string]func(s []byte){
		"nothing yet":        func(s []byte) {},
		"magic sector only":  func(s []byte) { copy(s[:512], b) },
		"later sector only":  func(s []byte) { copy(s[512:1024], b[512:]) },
		"all but last bytes": func(s []byte) { copy(s, b[:200]) },
	} {
		m := newMem(HeaderSize)
		copy(m.b, intentMagic)
		frag(m.b[SlotSize:])
		_, rep, err := ReadHeader(m, 0)
		if !errors.Is(err, ErrHeaderIncomplete) || !errors.Is(err, ErrNoHeader) || rep.Used != -1 {
			t.Errorf("%s: %v", name, err)
		}
	}
	// The mirror image (fragment in slot 0, slot 1 zero) is not something
	// WriteHeader leaves behind, so it is not treated as blank.
	m := newMem(HeaderSize)
	copy(m.b, b[:200])
	if _, _, err := ReadHeader(m, 0); errors.Is(err, ErrNoHeader) || !errors.Is(err, ErrCorruptHeader) {
		t.Errorf("fragment in slot 0: %v", err)
	}
}

func errorKindOK(err error) bool {
	return errors.Is(err, ErrNoHeader) || errors.Is(err, ErrNotPlinth) || errors.Is(err, ErrCorruptHeader)
}

func trimZeros(b []byte) []byte { return bytes.TrimRight(b, "\x00") }

func padSlot(b []byte) []byte {
	s := make([]byte, SlotSize)
	copy(s, b)
	return s
}

func FuzzDecodeHeader(f *testing.F) {
	for _, h := range []*Header{testHeader(), {Version: 1, State: StateReady, Mode: ModeAuthenticated, Filesystem: "ext4", PartitionID: testPartition, KeyPolicy: "x", Sequence: 1}} {
		b, err := h.Encode()
		if err != nil {
			f.Fatal(err)
		}
		f.Add(trimZeros(b))
	}
	f.Add([]byte{})
	f.Add([]byte("PLINTHDATA\x00\x01\x01\x00\x20\x00\x00\x00"))
	f.Add(bytes.Repeat([]byte{0xff}, 64))
	f.Fuzz(func(t *testing.T, data []byte) {
		// Raw (any length) and padded to a slot, where most inputs live.
		for _, b := range [][]byte{data, padSlot(data)} {
			h, err := DecodeHeader(b)
			if err != nil {
				if h != nil || !errorKindOK(err) {
					t.Fatalf("bad failure: %v %v", h, err)
				}
				continue
			}
			again, err := h.Encode()
			if err != nil {
				t.Fatalf("accepted header does not encode: %v", err)
			}
			if !bytes.Equal(again, b) {
				t.Fatal("accepted header re-encodes differently")
			}
		}
	})
}

func FuzzReadHeader(f *testing.F) {
	m := region(f, testHeader())
	f.Add(trimZeros(m.b[:SlotSize]), trimZeros(m.b[SlotSize:]))
	f.Add([]byte{}, trimZeros(m.b[SlotSize:]))
	f.Add(trimZeros(m.b[SlotSize:]), trimZeros(m.b[:SlotSize]))
	f.Add([]byte{}, []byte{})
	f.Add([]byte(intentMagic), []byte{})
	f.Add([]byte(intentMagic), trimZeros(m.b[SlotSize:])[:100])
	f.Fuzz(func(t *testing.T, s0, s1 []byte) {
		r := newMem(HeaderSize)
		copy(r.b, s0[:min(len(s0), SlotSize)])
		copy(r.b[SlotSize:], s1[:min(len(s1), SlotSize)])
		h, rep, err := ReadHeader(r, 0)
		if err != nil {
			if h != nil || rep.Used != -1 || !errorKindOK(err) {
				t.Fatalf("bad failure: %v %+v %v", h, rep, err)
			}
			// "No header" lets the caller format: only for a zero region
			// or the intent marker of a cut first write.
			marker := bytes.HasPrefix(r.b, []byte(intentMagic)) && allZero(r.b[len(intentMagic):SlotSize])
			switch {
			case errors.Is(err, ErrHeaderIncomplete) && !marker:
				t.Fatalf("incomplete without the intent marker: %v", err)
			case errors.Is(err, ErrNoHeader) && !errors.Is(err, ErrHeaderIncomplete) && !allZero(r.b):
				t.Fatalf("no header, but the region is not zero: %v", err)
			}
			return
		}
		slot := r.b[rep.Used*SlotSize : (rep.Used+1)*SlotSize]
		again, err := h.Encode()
		if err != nil || !bytes.Equal(again, slot) {
			t.Fatalf("returned header does not re-encode to its slot: %v", err)
		}
		if h.Sequence%2 != uint64(rep.Used) {
			t.Fatalf("sequence %d from slot %d", h.Sequence, rep.Used)
		}
		if o := rep.Slots[1-rep.Used]; o.Err == nil && o.Sequence > h.Sequence {
			t.Fatal("an older slot won")
		}
	})
}

func TestHeaderEnrolmentRoundTrip(t *testing.T) {
	h := testHeader()
	h.Enrolment = []byte("sealed join key and directory")
	b, err := h.Encode()
	if err != nil {
		t.Fatal(err)
	}
	got, err := DecodeHeader(b)
	if err != nil {
		t.Fatal(err)
	}
	if string(got.Enrolment) != string(h.Enrolment) {
		t.Fatalf("enrolment = %q, want %q", got.Enrolment, h.Enrolment)
	}
	// A header without the field decodes without it.
	h.Enrolment = nil
	b, _ = h.Encode()
	if got, err = DecodeHeader(b); err != nil || got.Enrolment != nil {
		t.Fatalf("without enrolment: %v, %q", err, got.Enrolment)
	}
}

// TestCutAfterCut: a cut in the second write leaves only the first copy
// valid; the next update must not write over that copy first, or a
// second cut would leave no header at all.
func TestCutAfterCut(t *testing.T) {
	ready := testHeader()
	ready.State, ready.SealedKey = StateReady, seq(2, 700)
	resealed := testHeader()
	resealed.State, resealed.SealedKey = StateReady, seq(3, 1500)
	damage := []func(int) bool{
		func(int) bool { return false },
		func(s int) bool { return s%2 == 0 },
		func(s int) bool { return s < 3 },
	}
	for di, d1 := range damage {
		for ki, k2 := range damage {
			d := &cutDevice{mem: mem{b: bytes.Clone(region(t, ready).b)}, cut: 1, keep: d1}
			h := *resealed
			h.Sequence = 2
			if err := WriteHeader(d, 0, &h); !errors.Is(err, errCut) {
				t.Fatal(err)
			}
			got, _, err := ReadHeader(&d.mem, 0)
			if err != nil {
				t.Fatalf("after the first cut (damage %d): %v", di, err)
			}
			// The next update, cut in its first write.
			again := *got
			again.SealedKey = seq(4, 900)
			d2 := &cutDevice{mem: d.mem, cut: 0, keep: k2}
			if err := WriteHeader(d2, 0, &again); !errors.Is(err, errCut) {
				t.Fatal(err)
			}
			if _, _, err := ReadHeader(&d2.mem, 0); err != nil {
				t.Fatalf("damage %d then %d: both copies lost: %v", di, ki, err)
			}
		}
	}
}
