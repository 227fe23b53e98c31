package eventlog

import (
	"bytes"
	"crypto/sha1"
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"encoding/json"
	"errors"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"testing"

	"github.com/google/go-tpm-tools/simulator"
	"github.com/google/go-tpm/tpm2/transport"

	"plinth.dev/plinth/platform/tpm"
)

// logWriter builds synthetic crypto-agile logs with SHA-1 and SHA-256
// digests. It writes what the TCG spec says, independently of Parse.
type logWriter struct {
	buf        bytes.Buffer
	boundaries []int // offsets after each complete event, header included
	events     []Event
}

func (w *logWriter) u16(v uint16) { w.buf.Write(binary.LittleEndian.AppendUint16(nil, v)) }
func (w *logWriter) u32(v uint32) { w.buf.Write(binary.LittleEndian.AppendUint32(nil, v)) }

// newLogWriter writes the TCG_PCR_EVENT header carrying a Spec ID Event03
// that lists SHA-1 and SHA-256.
func newLogWriter() *logWriter {
	var spec bytes.Buffer
	spec.WriteString("Spec ID Event03\x00")
	spec.Write([]byte{0, 0, 0, 0}) // platform class: client
	spec.Write([]byte{0, 2, 0, 2}) // spec 2.0 errata 0, UINTN 8 bytes
	spec.Write([]byte{2, 0, 0, 0}) // two algorithms
	spec.Write([]byte{0x04, 0x00, 20, 0, 0x0b, 0x00, 32, 0})
	spec.Write([]byte{3, 'x', 'y', 'z'}) // vendor info
	w := &logWriter{}
	w.u32(0)
	w.u32(EvNoAction)
	w.buf.Write(make([]byte, 20))
	w.u32(uint32(spec.Len()))
	w.buf.Write(spec.Bytes())
	w.boundaries = append(w.boundaries, w.buf.Len())
	w.events = append(w.events, Event{Index: 0, PCR: 0, Type: EvNoAction,
		Digests: map[uint16][]byte{algSHA1: make([]byte, 20)}, Data: spec.Bytes()})
	return w
}

// eventDigest writes a TCG_PCR_EVENT2 with the given SHA-256 digest and
// a SHA-1 digest of data.
func (w *logWriter) eventDigest(pcr, typ uint32, d256 []byte, data []byte) {
	d1 := sha1.Sum(data)
	w.u32(pcr)
	w.u32(typ)
	w.u32(2)
	w.u16(algSHA1)
	w.buf.Write(d1[:])
	w.u16(AlgSHA256)
	w.buf.Write(d256)
	w.u32(uint32(len(data)))
	w.buf.Write(data)
	w.boundaries = append(w.boundaries, w.buf.Len())
	w.events = append(w.events, Event{Index: len(w.events), PCR: pcr, Type: typ,
		Digests: map[uint16][]byte{algSHA1: d1[:], AlgSHA256: d256}, Data: data})
}

// event writes a TCG_PCR_EVENT2 whose digests are the hashes of data.
func (w *logWriter) event(pcr, typ uint32, data []byte) {
	d := sha256.Sum256(data)
	w.eventDigest(pcr, typ, d[:], data)
}

func extend(pcr, d []byte, h func([]byte) []byte) []byte {
	return h(append(slices.Clone(pcr), d...))
}

func sum256(b []byte) []byte { s := sha256.Sum256(b); return s[:] }
func sum1(b []byte) []byte   { s := sha1.Sum(b); return s[:] }

// synthetic is a small log in the shape of an OVMF one, with two
// applications in PCR 4 and a StartupLocality event saying locality 0.
func synthetic() *logWriter {
	w := newLogWriter()
	w.event(0, EvNoAction, append([]byte("StartupLocality\x00"), 0))
	w.event(0, 0x8, []byte{0, 0})
	w.event(7, 0x80000001, []byte("SecureBoot"))
	w.event(4, EvEFIAction, []byte("Calling EFI Application from Boot Option"))
	for _, pcr := range []uint32{0, 4, 7} {
		w.event(pcr, EvSeparator, []byte{0, 0, 0, 0})
	}
	w.event(4, EvNoAction, []byte("not extended"))
	w.eventDigest(4, EvEFIBootServicesApplication, sum256([]byte("uki")), []byte("device path of the UKI"))
	w.eventDigest(4, EvEFIBootServicesApplication, sum256([]byte("kernel")), []byte{})
	w.event(11, 0xd, []byte(".linux"))
	return w
}

func openSim(t *testing.T) *tpm.TPM {
	t.Helper()
	sim, err := simulator.GetWithFixedSeedInsecure(1)
	if err != nil {
		t.Fatal(err)
	}
	chip := tpm.New(transport.FromReadWriteCloser(sim), "simulator")
	t.Cleanup(func() { chip.Close() })
	return chip
}

func TestSyntheticRoundTripAndReplay(t *testing.T) {
	w := synthetic()
	events, err := Parse(w.buf.Bytes())
	if err != nil {
		t.Fatal(err)
	}
	if len(events) != len(w.events) {
		t.Fatalf("parsed %d events, wrote %d", len(events), len(w.events))
	}
	for i := range events {
		got, want := events[i], w.events[i]
		if got.Index != want.Index || got.PCR != want.PCR || got.Type != want.Type ||
			!bytes.Equal(got.Data, want.Data) || len(got.Digests) != len(want.Digests) {
			t.Fatalf("event %d = %+v, want %+v", i, got, want)
		}
		for alg, d := range want.Digests {
			if !bytes.Equal(got.Digests[alg], d) {
				t.Fatalf("event %d digest 0x%04x = %x, want %x", i, alg, got.Digests[alg], d)
			}
		}
	}

	// Extend a TPM simulator with the same measurements. tpm.Extend hashes
	// its argument, so the synthetic events whose SHA-256 digest is the
	// hash of their data are extended with that data, and the two
	// applications with the data their digests are the hash of.
	chip := openSim(t)
	for _, ev := range w.events[1:] {
		if ev.Type == EvNoAction {
			continue
		}
		data := ev.Data
		if ev.Type == EvEFIBootServicesApplication {
			data = map[string][]byte{
				string(sum256([]byte("uki"))):    []byte("uki"),
				string(sum256([]byte("kernel"))): []byte("kernel"),
			}[string(ev.Digests[AlgSHA256])]
		}
		if err := chip.Extend(int(ev.PCR), data); err != nil {
			t.Fatal(err)
		}
	}
	pcrs := []int{0, 4, 7, 11, 12}
	live, err := chip.ReadPCRs(pcrs)
	if err != nil {
		t.Fatal(err)
	}
	for _, pcr := range pcrs {
		got, err := Replay(events, uint32(pcr), AlgSHA256)
		if err != nil {
			t.Fatal(err)
		}
		if !bytes.Equal(got, live[pcr]) {
			t.Errorf("Replay PCR %d = %x, simulator %x", pcr, got, live[pcr])
		}
	}

	// The SHA-1 bank, by hand (tpm.Extend only extends SHA-256).
	want := make([]byte, 20)
	for _, d := range [][]byte{[]byte("Calling EFI Application from Boot Option"), {0, 0, 0, 0}, []byte("device path of the UKI"), {}} {
		want = extend(want, sum1(d), sum1)
	}
	if got, err := Replay(events, 4, algSHA1); err != nil || !bytes.Equal(got, want) {
		t.Errorf("Replay PCR 4 SHA-1 = %x, %v; want %x", got, err, want)
	}

	if got := Applications(events); len(got) != 2 || !bytes.Equal(got[0], sum256([]byte("uki"))) || !bytes.Equal(got[1], sum256([]byte("kernel"))) {
		t.Errorf("Applications = %x", got)
	}
	p4, err := PredictPCR4(events, Applications(events))
	if err != nil || !bytes.Equal(p4, live[4]) {
		t.Errorf("PredictPCR4 with this boot's digests = %x, %v; want %x", p4, err, live[4])
	}
	if _, err := Replay(events, 4, 0x0012); err == nil {
		t.Error("Replay in an unsupported bank succeeded")
	}
}

func TestStartupLocality(t *testing.T) {
	for _, tc := range []struct {
		pcr      uint32 // PCR the StartupLocality event is logged in
		locality byte
		initial  byte // last byte of PCR 0's initial value
	}{
		{0, 0, 0}, {0, 3, 3}, {0, 4, 4}, {0, 2, 0}, {1, 3, 0},
	} {
		w := newLogWriter()
		w.event(tc.pcr, EvNoAction, append([]byte("StartupLocality\x00"), tc.locality))
		w.event(0, 0x8, []byte{0, 0})
		events, err := Parse(w.buf.Bytes())
		if err != nil {
			t.Fatal(err)
		}
		init := make([]byte, 32)
		init[31] = tc.initial
		want := extend(init, sum256([]byte{0, 0}), sum256)
		if got, err := Replay(events, 0, AlgSHA256); err != nil || !bytes.Equal(got, want) {
			t.Errorf("StartupLocality %d in PCR %d: PCR 0 = %x, %v; want %x", tc.locality, tc.pcr, got, err, want)
		}
	}
}

func TestTruncatedAndPadded(t *testing.T) {
	w := synthetic()
	full := w.buf.Bytes()
	for n := range len(full) {
		events, err := Parse(full[:n])
		if i := slices.Index(w.boundaries, n); i >= 0 {
			if err != nil || len(events) != i+1 {
				t.Fatalf("cut after event %d: %d events, %v", i, len(events), err)
			}
		} else if err == nil {
			t.Fatalf("truncated to %d of %d bytes: no error", n, len(full))
		}
	}

	end := binary.LittleEndian.AppendUint32(nil, pcrEndOfLog)
	for name, tail := range map[string][]byte{
		"0xFF padding":   bytes.Repeat([]byte{0xff}, 3),
		"0x00 padding":   make([]byte, 4096),
		"PCR 0xFFFFFFFF": append(end, "rest is ignored"...),
	} {
		events, err := Parse(append(slices.Clone(full), tail...))
		if err != nil || len(events) != len(w.events) {
			t.Errorf("%s: %d events, %v", name, len(events), err)
		}
	}
	// A few zero bytes are the start of a PCR 0 event, not padding.
	if _, err := Parse(append(slices.Clone(full), 0, 0, 0, 0)); err == nil {
		t.Error("4 trailing zero bytes accepted")
	}
}

func TestMalformed(t *testing.T) {
	w := newLogWriter()
	header := w.buf.Bytes()
	if ev, err := Parse(header); err != nil || len(ev) != 1 {
		t.Fatalf("header only: %d events, %v", len(ev), err)
	}

	// A SHA-1 log starts with a measurement, or a TPM 1.2 Spec ID event.
	legacy := slices.Clone(header)
	legacy[4] = 8 // EV_S_CRTM_VERSION
	old := bytes.Replace(slices.Clone(header), []byte("Event03"), []byte("Event00"), 1)
	for _, b := range [][]byte{legacy, old} {
		if _, err := Parse(b); !errors.Is(err, ErrNotCryptoAgile) {
			t.Errorf("legacy log: %v, want ErrNotCryptoAgile", err)
		}
	}
	if _, err := Parse(nil); err == nil || errors.Is(err, ErrNotCryptoAgile) {
		t.Errorf("empty log: %v", err)
	}

	// An event with a digest for an algorithm the header does not list.
	bad := newLogWriter()
	bad.u32(0)
	bad.u32(0x8)
	bad.u32(1)
	bad.u16(algSHA384)
	bad.buf.Write(make([]byte, 48))
	bad.u32(0)
	if _, err := Parse(bad.buf.Bytes()); err == nil {
		t.Error("unknown digest algorithm accepted")
	}
	// More digests than algorithms, and a duplicate digest.
	for _, digests := range [][]uint16{{algSHA1, AlgSHA256, AlgSHA256}, {AlgSHA256, AlgSHA256}} {
		bad := newLogWriter()
		bad.u32(0)
		bad.u32(0x8)
		bad.u32(uint32(len(digests)))
		for _, a := range digests {
			bad.u16(a)
			bad.buf.Write(make([]byte, knownDigestSizes[a]))
		}
		bad.u32(0)
		if _, err := Parse(bad.buf.Bytes()); err == nil {
			t.Errorf("digests %v accepted", digests)
		}
	}
	// A Spec ID header with a wrong SHA-256 size, and with no algorithms.
	for _, patch := range []func([]byte){
		func(b []byte) { b[bytes.Index(b, []byte{0x0b, 0, 32, 0})+2] = 20 },
		func(b []byte) { b[bytes.Index(b, []byte{2, 0, 0, 0, 4, 0})] = 0 },
	} {
		b := slices.Clone(header)
		patch(b)
		if _, err := Parse(b); err == nil {
			t.Error("bad Spec ID header accepted")
		}
	}

	// Replay needs a digest in the requested bank for every extended event.
	events := []Event{{Index: 1, PCR: 4, Type: EvSeparator, Digests: map[uint16][]byte{algSHA1: make([]byte, 20)}}}
	if _, err := Replay(events, 4, AlgSHA256); err == nil {
		t.Error("Replay without a SHA-256 digest succeeded")
	}
	events[0].Digests[AlgSHA256] = make([]byte, 20)
	if _, err := Replay(events, 4, AlgSHA256); err == nil {
		t.Error("Replay with a short SHA-256 digest succeeded")
	}
}

// recorded are the facts of testdata/ovmf-uki.bin (see its "note").
type recorded struct {
	PCR4       string            `json:"pcr4"`
	PCR11      string            `json:"pcr11"`
	UKI        string            `json:"uki_authenticode"`
	Kernel     string            `json:"kernel_authenticode"`
	PCRs       map[string]string `json:"pcrs"`
	SecondBoot struct {
		UKI  string `json:"uki_authenticode"`
		PCR4 string `json:"pcr4"`
	} `json:"second_boot"`
}

func unhex(t *testing.T, s string) []byte {
	t.Helper()
	b, err := hex.DecodeString(s)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

func TestRecordedOVMF(t *testing.T) {
	events, err := Read(filepath.Join("testdata", "ovmf-uki.bin"))
	if err != nil {
		t.Fatal(err)
	}
	raw, err := os.ReadFile(filepath.Join("testdata", "ovmf-uki.json"))
	if err != nil {
		t.Fatal(err)
	}
	var rec recorded
	if err := json.Unmarshal(raw, &rec); err != nil {
		t.Fatal(err)
	}
	pcr4, ukiDigest, kernelDigest := unhex(t, rec.PCR4), unhex(t, rec.UKI), unhex(t, rec.Kernel)

	// OVMF's log: 44 events, every one with SHA-1, SHA-256, SHA-384 and
	// SHA-512 digests.
	if len(events) != 44 {
		t.Errorf("%d events, want 44", len(events))
	}
	for _, ev := range events[1:] {
		if len(ev.Digests) != 4 {
			t.Fatalf("event %d has %d digests", ev.Index, len(ev.Digests))
		}
	}

	// PCR 4 as logged: "Calling EFI Application from Boot Option" (the
	// first boot option, the empty DVD drive, fails), the separator,
	// "Returning from ..." and "Calling ..." again for the disk, the UKI,
	// then the kernel the systemd stub (252) starts with LoadImage.
	var types []uint32
	for _, ev := range events {
		if ev.PCR == 4 {
			types = append(types, ev.Type)
		}
	}
	wantTypes := []uint32{EvEFIAction, EvSeparator, EvEFIAction, EvEFIAction, EvEFIBootServicesApplication, EvEFIBootServicesApplication}
	if !slices.Equal(types, wantTypes) {
		t.Errorf("PCR 4 event types %#x, want %#x", types, wantTypes)
	}

	// Every PCR the firmware log covers replays to the live value. PCR 10
	// is Linux IMA, which logs elsewhere (ascii_runtime_measurements);
	// PCRs 8 and 12-15 were never extended and replay to zero. PCR 11 is
	// in the firmware log too: systemd-stub 252 measures each UKI section
	// name and section through the firmware's TCG2 protocol (EV_IPL
	// events), so the replay equals the live PCR 11.
	for i := range 16 {
		got, err := Replay(events, uint32(i), AlgSHA256)
		if err != nil {
			t.Fatal(err)
		}
		want := unhex(t, rec.PCRs[strconv.Itoa(i)])
		if match := bytes.Equal(got, want); match != (i != 10) {
			t.Errorf("Replay PCR %d = %x, live %x", i, got, want)
		}
	}
	if got, _ := Replay(events, 4, AlgSHA256); !bytes.Equal(got, pcr4) {
		t.Errorf("Replay PCR 4 = %x, recorded %x", got, pcr4)
	}
	if got, _ := Replay(events, 11, AlgSHA256); !bytes.Equal(got, unhex(t, rec.PCR11)) {
		t.Errorf("Replay PCR 11 = %x, recorded %x", got, rec.PCR11)
	}

	apps := Applications(events)
	if len(apps) != 2 || !bytes.Equal(apps[0], ukiDigest) || !bytes.Equal(apps[1], kernelDigest) {
		t.Fatalf("Applications = %x, want [UKI %x, kernel %x]", apps, ukiDigest, kernelDigest)
	}
	if got, err := PredictPCR4(events, [][]byte{ukiDigest, kernelDigest}); err != nil || !bytes.Equal(got, pcr4) {
		t.Errorf("PredictPCR4(this UKI) = %x, %v; want %x", got, err, pcr4)
	}

	// Another UKI: the prediction differs, equals a replay by hand, and is
	// what the second recorded boot (same VM, another .cmdline) measured.
	other := unhex(t, rec.SecondBoot.UKI)
	got, err := PredictPCR4(events, [][]byte{other, kernelDigest})
	if err != nil {
		t.Fatal(err)
	}
	manual := make([]byte, 32)
	replaced := 0
	for _, ev := range events {
		if ev.PCR != 4 || ev.Type == EvNoAction {
			continue
		}
		d := ev.Digests[AlgSHA256]
		if ev.Type == EvEFIBootServicesApplication && replaced == 0 {
			d, replaced = other, 1
		}
		manual = extend(manual, d, sum256)
	}
	if bytes.Equal(got, pcr4) || !bytes.Equal(got, manual) {
		t.Errorf("PredictPCR4(other UKI) = %x; this boot %x, manual replay %x", got, pcr4, manual)
	}
	if !bytes.Equal(got, unhex(t, rec.SecondBoot.PCR4)) {
		t.Errorf("PredictPCR4(other UKI) = %x, its real boot measured %s", got, rec.SecondBoot.PCR4)
	}

	for _, apps := range [][][]byte{{ukiDigest}, {ukiDigest, kernelDigest, kernelDigest}, nil, {ukiDigest, kernelDigest[:20]}} {
		if _, err := PredictPCR4(events, apps); err == nil {
			t.Errorf("PredictPCR4 with %d digests succeeded", len(apps))
		}
	}
}

func FuzzParse(f *testing.F) {
	f.Add(synthetic().buf.Bytes())
	f.Add(newLogWriter().buf.Bytes())
	if b, err := os.ReadFile(filepath.Join("testdata", "ovmf-uki.bin")); err == nil {
		f.Add(b)
	}
	f.Add([]byte{})
	f.Fuzz(func(t *testing.T, b []byte) {
		events, err := Parse(b)
		if err != nil {
			return
		}
		for i, ev := range events {
			if ev.Index != i {
				t.Fatalf("event %d has Index %d", i, ev.Index)
			}
		}
		// Whatever parses can be replayed or refused, without panicking.
		for _, pcr := range []uint32{0, 4, 7} {
			Replay(events, pcr, AlgSHA256)
		}
		PredictPCR4(events, Applications(events))
	})
}

// TestFirstBootAttempt: a log with a failed boot attempt before the UKI
// (EDK2's "Returning ..." and a second "Calling ..." in PCR 4) becomes the
// log of a boot that started the UKI at once; events of other PCRs and
// types stay, in order.
func TestFirstBootAttempt(t *testing.T) {
	action := func(pcr uint32, s string) Event { return Event{PCR: pcr, Type: EvEFIAction, Data: []byte(s)} }
	app := Event{PCR: 4, Type: EvEFIBootServicesApplication, Data: []byte("uki")}
	sep := Event{PCR: 4, Type: EvSeparator}
	events := []Event{
		action(4, actionCalling), sep, {PCR: 7, Type: EvSeparator},
		action(4, actionReturning), action(4, actionCalling+"\x00"), app,
		action(5, actionReturning),
	}
	got := FirstBootAttempt(events)
	want := []Event{action(4, actionCalling), sep, {PCR: 7, Type: EvSeparator}, app, action(5, actionReturning)}
	if len(got) != len(want) {
		t.Fatalf("%d events, want %d: %+v", len(got), len(want), got)
	}
	for i := range want {
		if got[i].PCR != want[i].PCR || got[i].Type != want[i].Type || !bytes.Equal(got[i].Data, want[i].Data) {
			t.Errorf("event %d: %+v, want %+v", i, got[i], want[i])
		}
	}
	if n := len(FirstBootAttempt(want)); n != len(want) {
		t.Errorf("a first-attempt log lost events: %d of %d", n, len(want))
	}
}
