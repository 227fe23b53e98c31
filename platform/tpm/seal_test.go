package tpm

import (
	"bytes"
	"crypto/rand"
	"errors"
	"slices"
	"testing"
)

var testPCRs = []int{7, 15}

func mustSeal(t *testing.T, tp *TPM, secret []byte, pcrs []int) []byte {
	t.Helper()
	blob, err := tp.Seal(secret, pcrs)
	if err != nil {
		t.Fatalf("Seal: %v", err)
	}
	return blob
}

func mustUnseal(t *testing.T, tp *TPM, blob, want []byte) {
	t.Helper()
	got, err := tp.Unseal(blob)
	if err != nil {
		t.Fatalf("Unseal: %v", err)
	}
	if !bytes.Equal(got, want) {
		t.Fatalf("Unseal returned %d bytes, not the %d sealed", len(got), len(want))
	}
}

// wantMismatch checks err is a *PCRMismatchError naming exactly pcrs.
func wantMismatch(t *testing.T, err error, pcrs ...int) {
	t.Helper()
	var mm *PCRMismatchError
	if !errors.As(err, &mm) {
		t.Fatalf("Unseal error = %v, want *PCRMismatchError", err)
	}
	if !slices.Equal(mm.PCRs, pcrs) {
		t.Fatalf("PCRMismatchError.PCRs = %v, want %v", mm.PCRs, pcrs)
	}
}

func TestSealRoundTrip(t *testing.T) {
	tp := openSim(t, 1)
	big := make([]byte, 1<<20)
	rand.Read(big)
	for name, secret := range map[string][]byte{
		"empty": {},
		"small": []byte("node unlock key"),
		"1MiB":  big,
	} {
		t.Run(name, func(t *testing.T) {
			blob := mustSeal(t, tp, secret, testPCRs)
			mustUnseal(t, tp, blob, secret)
			// Sealing is randomised: same input, different blob.
			if again := mustSeal(t, tp, secret, testPCRs); bytes.Equal(again, blob) {
				t.Error("two seals produced the same blob")
			}
		})
	}
}

func TestUnsealRefusedAfterExtend(t *testing.T) {
	tp := openSim(t, 1)
	secret := []byte("s3cret")
	blob := mustSeal(t, tp, secret, testPCRs)
	if err := tp.Extend(15, []byte("something else booted")); err != nil {
		t.Fatal(err)
	}
	_, err := tp.Unseal(blob)
	wantMismatch(t, err, 15)
	if want := "TPM refused to unseal: PCR 15 differs from the value sealed to"; err.Error() != want {
		t.Errorf("Error() = %q, want %q", err, want)
	}

	if err := tp.Extend(7, []byte("secure boot off")); err != nil {
		t.Fatal(err)
	}
	_, err = tp.Unseal(blob)
	wantMismatch(t, err, 7, 15)
	if want := "TPM refused to unseal: PCRs 7, 15 differ from the values sealed to"; err.Error() != want {
		t.Errorf("Error() = %q, want %q", err, want)
	}
	checkNoLeaks(t, tp)
}

func TestOtherPCRsDoNotMatter(t *testing.T) {
	tp := openSim(t, 1)
	secret := []byte("s3cret")
	blob := mustSeal(t, tp, secret, testPCRs)
	if err := tp.Extend(16, []byte("unrelated")); err != nil {
		t.Fatal(err)
	}
	mustUnseal(t, tp, blob, secret)

	// A different, larger and unsorted list with duplicates, including
	// the PCR just extended.
	other := []int{16, 0, 4, 11, 4, 23}
	blob2 := mustSeal(t, tp, secret, other)
	if err := tp.Extend(15, []byte("not in the second list")); err != nil {
		t.Fatal(err)
	}
	mustUnseal(t, tp, blob2, secret)
	_, err := tp.Unseal(blob)
	wantMismatch(t, err, 15)
	if err := tp.Extend(23, nil); err != nil {
		t.Fatal(err)
	}
	_, err = tp.Unseal(blob2)
	wantMismatch(t, err, 23)
}

func TestSealToPredicted(t *testing.T) {
	tp := openSim(t, 1)
	measurement := []byte("next image: root hash 1234, node parameters")
	cur, err := tp.ReadPCRs(testPCRs)
	if err != nil {
		t.Fatal(err)
	}
	expected := map[int][]byte{7: cur[7], 15: extended(cur[15], measurement)}
	secret := []byte("disk key for the next boot")
	blob, err := tp.SealTo(secret, expected)
	if err != nil {
		t.Fatal(err)
	}
	_, err = tp.Unseal(blob)
	wantMismatch(t, err, 15)

	if err := tp.Extend(15, measurement); err != nil {
		t.Fatal(err)
	}
	mustUnseal(t, tp, blob, secret)
}

func TestSealBadArguments(t *testing.T) {
	tp := openSim(t, 1)
	if _, err := tp.Seal([]byte("x"), nil); err == nil {
		t.Error("Seal with no PCRs succeeded")
	}
	if _, err := tp.Seal([]byte("x"), []int{24}); err == nil {
		t.Error("Seal with PCR 24 succeeded")
	}
	if _, err := tp.SealTo([]byte("x"), map[int][]byte{}); err == nil {
		t.Error("SealTo with no PCRs succeeded")
	}
	if _, err := tp.SealTo([]byte("x"), map[int][]byte{7: make([]byte, 20)}); err == nil {
		t.Error("SealTo with a SHA-1-sized value succeeded")
	}
	if _, err := tp.SealTo([]byte("x"), map[int][]byte{-1: make([]byte, 32)}); err == nil {
		t.Error("SealTo with PCR -1 succeeded")
	}
}

// TestLockAfterUnseal is the boot sequence: unseal, then extend a sealed
// PCR so nothing later in the same boot can unseal again.
func TestLockAfterUnseal(t *testing.T) {
	tp := openSim(t, 1)
	secret := []byte("s3cret")
	blob := mustSeal(t, tp, secret, testPCRs)
	mustUnseal(t, tp, blob, secret)
	if err := tp.Extend(15, []byte("released")); err != nil {
		t.Fatal(err)
	}
	_, err := tp.Unseal(blob)
	wantMismatch(t, err, 15)
}

func TestWrongTPM(t *testing.T) {
	a := openSim(t, 1)
	secret := []byte("s3cret")
	blob := mustSeal(t, a, secret, testPCRs)
	mustUnseal(t, a, blob, secret)
	closeSim(t, a)

	b := openSim(t, 2)
	if _, err := b.Unseal(blob); !errors.Is(err, ErrWrongTPM) {
		t.Fatalf("Unseal on another TPM = %v, want ErrWrongTPM", err)
	}
	checkNoLeaks(t, b)
	closeSim(t, b)

	// Same seed, fresh simulator: the same TPM after a reboot.
	c := openSim(t, 1)
	mustUnseal(t, c, blob, secret)
}

func TestCorruptBlob(t *testing.T) {
	tp := openSim(t, 1)
	secret := []byte("s3cret payload")
	blob := mustSeal(t, tp, secret, testPCRs)

	check := func(name string, bad []byte) {
		t.Helper()
		got, err := tp.Unseal(bad)
		if err == nil {
			t.Errorf("%s: Unseal succeeded (returned %q)", name, got)
			return
		}
		var mm *PCRMismatchError
		if !errors.Is(err, ErrCorruptBlob) && !errors.Is(err, ErrWrongTPM) && !errors.As(err, &mm) {
			t.Errorf("%s: unexpected error class: %v", name, err)
		}
	}

	// Every byte, since the whole blob is small: magic, version, PCR
	// list and values, SRK name, public, private, nonce, ciphertext, tag.
	for i := range blob {
		bad := slices.Clone(blob)
		bad[i] ^= 0x41
		check("flip byte", bad)
	}
	for _, n := range []int{0, 1, 8, 12, 13, 40, len(blob) / 2, len(blob) - 17, len(blob) - 1} {
		check("truncate", blob[:n])
	}
	check("trailing byte", append(slices.Clone(blob), 0))
	garbage := make([]byte, 4096)
	for range 20 {
		rand.Read(garbage)
		check("garbage", garbage)
		check("garbage after magic", append([]byte(blobMagic), garbage...))
	}

	// After all that the TPM must still work, and have no leaked handles.
	mustUnseal(t, tp, blob, secret)
	checkNoLeaks(t, tp)
}
