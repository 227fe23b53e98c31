package measure

import (
	"bytes"
	"crypto/sha256"
	"errors"
	"strings"
	"testing"

	"github.com/google/go-tpm-tools/simulator"
	"github.com/google/go-tpm/tpm2/transport"

	"plinth.dev/plinth/platform/tpm"
)

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

// TestBootLockAndPrediction: the PCR 15 value /init produces is the one
// ExpectedPCR15 predicts, a key sealed by TPMKeys opens after Boot and not
// after Lock, and a boot with other parameters cannot open it.
func TestBootLockAndPrediction(t *testing.T) {
	chip := openSim(t)
	params := sha256.Sum256([]byte("parameters"))
	root := bytes.Repeat([]byte{0xab}, 32)
	if err := Boot(chip, params, root); err != nil {
		t.Fatal(err)
	}
	v, err := chip.ReadPCRs([]int{PCR})
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(v[PCR], ExpectedPCR15(params, root)) {
		t.Fatalf("PCR %d = %x, predicted %x", PCR, v[PCR], ExpectedPCR15(params, root))
	}
	keys := TPMKeys{TPM: chip}
	nuk := bytes.Repeat([]byte{7}, 32)
	blob, err := keys.Seal(nuk)
	if err != nil {
		t.Fatal(err)
	}
	if got, err := keys.Unseal(blob); err != nil || !bytes.Equal(got, nuk) {
		t.Fatalf("unseal after Boot: %v", err)
	}
	if err := Lock(chip); err != nil {
		t.Fatal(err)
	}
	if _, err := keys.Unseal(blob); err == nil {
		t.Fatal("unsealed after Lock")
	}
	if _, err := (TPMKeys{TPM: chip, PCRs: []int{4, 7}}).Seal(nuk); err == nil {
		t.Fatal("sealed without PCR 15 in the policy")
	}
	if ExpectedPCR15(sha256.Sum256([]byte("other")), root) == nil || bytes.Equal(ExpectedPCR15(sha256.Sum256([]byte("other")), root), v[PCR]) {
		t.Fatal("other parameters predict the same PCR 15")
	}
}

func TestInsecureKeys(t *testing.T) {
	k := InsecureKeys{}
	key := bytes.Repeat([]byte{1}, 32)
	blob, _ := k.Seal(key)
	if got, err := k.Unseal(blob); err != nil || !bytes.Equal(got, key) || k.Policy() == (TPMKeys{}).Policy() {
		t.Fatalf("insecure round trip: %v", err)
	}
	if _, err := k.Unseal([]byte("short")); err == nil {
		t.Fatal("accepted a short stored key")
	}
}

// TestUnmeasuredBootSealsNothingNew: on a boot the firmware did not
// measure, TPMKeys refuses to seal a new key (ErrUnmeasuredBoot, also from
// CanSeal, which storage asks before it writes) and still unseals an
// existing one.
func TestUnmeasuredBootSealsNothingNew(t *testing.T) {
	chip := openSim(t)
	params := sha256.Sum256([]byte("parameters"))
	if err := Boot(chip, params, bytes.Repeat([]byte{1}, 32)); err != nil {
		t.Fatal(err)
	}
	nuk := bytes.Repeat([]byte{9}, 32)
	blob, err := (TPMKeys{TPM: chip}).Seal(nuk)
	if err != nil {
		t.Fatal(err)
	}
	fw := Firmware{}
	if fw.Measured() || fw.Gap() == "" {
		t.Fatalf("direct boot counted as measured: %+v %q", fw, fw.Gap())
	}
	keys := TPMKeys{TPM: chip, Unmeasured: fw.Gap()}
	if _, err := keys.Seal(nuk); !errors.Is(err, ErrUnmeasuredBoot) {
		t.Fatalf("Seal on an unmeasured boot: %v", err)
	}
	if err := keys.CanSeal(); !errors.Is(err, ErrUnmeasuredBoot) || !strings.Contains(err.Error(), "allow_unmeasured_boot") {
		t.Fatalf("CanSeal: %v", err)
	}
	if got, err := keys.Unseal(blob); err != nil || !bytes.Equal(got, nuk) {
		t.Fatalf("existing key on an unmeasured boot: %v", err)
	}
	for _, c := range []struct {
		fw   Firmware
		want bool
	}{
		{Firmware{UEFI: true, StubPCR11: true, BootApps: 2}, true},
		{Firmware{UEFI: true, StubPCR11: false, BootApps: 2}, false},
		{Firmware{UEFI: true, StubPCR11: true, BootApps: 0}, false},
	} {
		if c.fw.Measured() != c.want || (c.fw.Gap() == "") != c.want {
			t.Errorf("%+v: measured %v gap %q", c.fw, c.fw.Measured(), c.fw.Gap())
		}
	}
}
