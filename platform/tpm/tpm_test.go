package tpm

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"testing"

	"github.com/google/go-tpm-tools/simulator"
	"github.com/google/go-tpm/tpm2"
	"github.com/google/go-tpm/tpm2/transport"
)

// openSim starts the (process-wide, singleton) simulator with a fixed seed
// and closes it at the end of the test. Tests using it must not run in
// parallel: a second Get blocks until the first is closed.
func openSim(t *testing.T, seed int64) *TPM {
	t.Helper()
	sim, err := simulator.GetWithFixedSeedInsecure(seed)
	if err != nil {
		t.Fatalf("simulator: %v", err)
	}
	tp := New(transport.FromReadWriteCloser(sim), "simulator")
	// Closing twice is harmless (the simulator reports an error and keeps
	// its lock state), so tests may also close early with closeSim.
	t.Cleanup(func() { tp.Close() })
	return tp
}

// closeSim closes a simulator opened by openSim before the test ends.
func closeSim(t *testing.T, tp *TPM) {
	t.Helper()
	if err := tp.Close(); err != nil {
		t.Fatalf("close simulator: %v", err)
	}
}

func TestName(t *testing.T) {
	tp := openSim(t, 1)
	if tp.Name() != "simulator" {
		t.Errorf("Name() = %q", tp.Name())
	}
}

func TestRandom(t *testing.T) {
	tp := openSim(t, 1)
	for _, n := range []int{0, 1, 32, 33, 100, 1000} {
		a, err := tp.Random(n)
		if err != nil {
			t.Fatalf("Random(%d): %v", n, err)
		}
		if len(a) != n {
			t.Fatalf("Random(%d) returned %d bytes", n, len(a))
		}
		if n < 16 {
			continue
		}
		b, err := tp.Random(n)
		if err != nil {
			t.Fatal(err)
		}
		if bytes.Equal(a, b) {
			t.Errorf("Random(%d) returned the same bytes twice", n)
		}
		if bytes.Equal(a, make([]byte, n)) {
			t.Errorf("Random(%d) returned zeros", n)
		}
	}
	if _, err := tp.Random(-1); err == nil {
		t.Error("Random(-1) succeeded")
	}
}

func TestReadPCRsAndExtend(t *testing.T) {
	tp := openSim(t, 1)
	all := make([]int, numPCRs)
	for i := range all {
		all[i] = i
	}
	// More than the 8 a single PCR_Read returns, to exercise the loop.
	before, err := tp.ReadPCRs(all)
	if err != nil {
		t.Fatal(err)
	}
	if len(before) != numPCRs {
		t.Fatalf("ReadPCRs returned %d PCRs, want %d", len(before), numPCRs)
	}
	zero := make([]byte, sha256.Size)
	if !bytes.Equal(before[15], zero) {
		t.Fatalf("PCR 15 starts at %x, want zeros", before[15])
	}

	want := before[15]
	for _, data := range [][]byte{[]byte("first"), nil, bytes.Repeat([]byte{7}, 5000)} {
		if err := tp.Extend(15, data); err != nil {
			t.Fatal(err)
		}
		want = extended(want, data)
	}
	after, err := tp.ReadPCRs([]int{15, 15, 16})
	if err != nil {
		t.Fatal(err)
	}
	if len(after) != 2 {
		t.Errorf("ReadPCRs with a duplicate returned %d PCRs", len(after))
	}
	if !bytes.Equal(after[15], want) {
		t.Errorf("PCR 15 = %x, want %x", after[15], want)
	}
	if !bytes.Equal(after[16], before[16]) {
		t.Errorf("PCR 16 changed")
	}

	for _, bad := range []int{-1, numPCRs} {
		if err := tp.Extend(bad, nil); err == nil {
			t.Errorf("Extend(%d) succeeded", bad)
		}
		if _, err := tp.ReadPCRs([]int{bad}); err == nil {
			t.Errorf("ReadPCRs(%d) succeeded", bad)
		}
	}
}

// extended is the software model of PCR_Extend on the SHA-256 bank with
// sha256(data).
func extended(old, data []byte) []byte {
	d := sha256.Sum256(data)
	n := sha256.Sum256(append(append([]byte{}, old...), d[:]...))
	return n[:]
}

// TestPolicyPCRMatchesTPM checks the software policy computation SealTo
// depends on against go-tpm's calculator and a TPM trial session.
func TestPolicyPCRMatchesTPM(t *testing.T) {
	tp := openSim(t, 1)
	if err := tp.Extend(15, []byte("x")); err != nil {
		t.Fatal(err)
	}
	idx := []int{0, 7, 9, 15}
	cur, err := tp.ReadPCRs(idx)
	if err != nil {
		t.Fatal(err)
	}
	var pcrs []sealedPCR
	var concat []byte
	for _, i := range idx {
		pcrs = append(pcrs, sealedPCR{i, cur[i]})
		concat = append(concat, cur[i]...)
	}
	ours := policyPCR(pcrs)

	calc, err := tpm2.NewPolicyCalculator(tpm2.TPMAlgSHA256)
	if err != nil {
		t.Fatal(err)
	}
	d := sha256.Sum256(concat)
	if err := (tpm2.PolicyPCR{Pcrs: pcrSelection(idx), PcrDigest: tpm2.TPM2BDigest{Buffer: d[:]}}).Update(calc); err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(ours, calc.Hash().Digest) {
		t.Errorf("policyPCR = %x, go-tpm calculator = %x", ours, calc.Hash().Digest)
	}

	sess, closeSess, err := tpm2.PolicySession(tp.t, tpm2.TPMAlgSHA256, 16, tpm2.Trial())
	if err != nil {
		t.Fatal(err)
	}
	defer closeSess()
	if _, err := (tpm2.PolicyPCR{PolicySession: sess.Handle(), Pcrs: pcrSelection(idx)}).Execute(tp.t); err != nil {
		t.Fatal(err)
	}
	got, err := tpm2.PolicyGetDigest{PolicySession: sess.Handle()}.Execute(tp.t)
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(ours, got.PolicyDigest.Buffer) {
		t.Errorf("policyPCR = %x, TPM trial session = %x", ours, got.PolicyDigest.Buffer)
	}
}

// TestSRKTemplatePinned fails if the SRK template changes, e.g. with a
// go-tpm upgrade: every blob sealed so far would become ErrWrongTPM.
func TestSRKTemplatePinned(t *testing.T) {
	const want = "0023000b00030472000000060080004300100003001000200000000000000000000000000000000000000000000000000000000000000000" +
		"00200000000000000000000000000000000000000000000000000000000000000000"
	got := hex.EncodeToString(tpm2.Marshal(srkTemplate))
	if got != want {
		t.Errorf("SRK template changed:\n got %s\nwant %s", got, want)
	}
}

func TestOpenWithoutTPM(t *testing.T) {
	saved := devices
	defer func() { devices = saved }()
	devices = []string{t.TempDir() + "/tpmrm0", t.TempDir() + "/tpm0"}
	if _, err := Open(); !errors.Is(err, ErrNoTPM) {
		t.Errorf("Open() = %v, want ErrNoTPM", err)
	}
	// Present but not a device is a real error, not "no TPM".
	devices = []string{t.TempDir()}
	if _, err := Open(); err == nil || errors.Is(err, ErrNoTPM) {
		t.Errorf("Open() on a directory = %v, want a non-ErrNoTPM error", err)
	}
}

// checkNoLeaks fails if transient objects or sessions are still loaded: on
// /dev/tpm0 nothing would flush them, and a TPM holds only a few.
func checkNoLeaks(t *testing.T, tp *TPM) {
	t.Helper()
	for _, ht := range []tpm2.TPMHT{tpm2.TPMHTTransient, tpm2.TPMHTHMACSession, tpm2.TPMHTPolicySession} {
		rsp, err := tpm2.GetCapability{
			Capability:    tpm2.TPMCapHandles,
			Property:      uint32(ht) << 24,
			PropertyCount: 64,
		}.Execute(tp.t)
		if err != nil {
			t.Fatalf("GetCapability: %v", err)
		}
		handles, err := rsp.CapabilityData.Data.Handles()
		if err != nil {
			t.Fatal(err)
		}
		for _, h := range handles.Handle {
			// The capability lists from the given type onwards.
			if uint32(h)>>24 == uint32(ht) {
				t.Errorf("handle 0x%08x still loaded", uint32(h))
			}
		}
	}
}
