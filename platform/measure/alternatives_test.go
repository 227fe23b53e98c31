package measure

import (
	"bytes"
	"crypto/sha256"
	"testing"

	"github.com/google/go-tpm-tools/simulator"
	"github.com/google/go-tpm/tpm2/transport"

	"plinth.dev/plinth/platform/tpm"
)

// TestResealForUpdate: a key sealed while an update is pending opens on a
// boot of the running image and on a boot of the new one (its predicted
// PCR 15), not on a boot of a third image; resealed without the other set
// it opens only on the boot it was sealed on.
func TestResealForUpdate(t *testing.T) {
	sim, err := simulator.GetWithFixedSeedInsecure(1)
	if err != nil {
		t.Fatal(err)
	}
	chip := tpm.New(transport.FromReadWriteCloser(sim), "simulator")
	t.Cleanup(func() { chip.Close() })
	params := sha256.Sum256([]byte("parameters"))
	rootA, rootB, rootC := bytes.Repeat([]byte{0xa}, 32), bytes.Repeat([]byte{0xb}, 32), bytes.Repeat([]byte{0xc}, 32)
	pcrs := []int{7, PCR}
	// boot runs an image: a reset (reboot) and /init's measurements.
	boot := func(root []byte) map[int][]byte {
		t.Helper()
		if err := sim.Reset(); err != nil {
			t.Fatal(err)
		}
		if err := Boot(chip, params, root); err != nil {
			t.Fatal(err)
		}
		v, err := chip.ReadPCRs(pcrs)
		if err != nil {
			t.Fatal(err)
		}
		return v
	}
	nuk := bytes.Repeat([]byte{7}, 32)

	onA := boot(rootA)
	next := map[int][]byte{7: onA[7], PCR: ExpectedPCR15(params, rootB)}
	keys := TPMKeys{TPM: chip, PCRs: pcrs, Expected: onA, Other: func() map[int][]byte { return next }}
	blob, err := keys.Seal(nuk)
	if err != nil {
		t.Fatal(err)
	}
	if Alternatives(blob) != 2 {
		t.Fatalf("a blob sealed for a pending update holds %d alternatives", Alternatives(blob))
	}
	for _, b := range []struct {
		name string
		root []byte
		ok   bool
	}{{"running image", rootA, true}, {"new image", rootB, true}, {"unrelated image", rootC, false}} {
		v := boot(b.root)
		got, err := (TPMKeys{TPM: chip, PCRs: pcrs, Expected: v}).Unseal(blob)
		if b.ok && (err != nil || !bytes.Equal(got, nuk)) {
			t.Errorf("%s: %v", b.name, err)
		}
		if !b.ok && err == nil {
			t.Errorf("%s: unsealed the key", b.name)
		}
	}

	// Confirmed on b: sealed to b's boot only.
	onB := boot(rootB)
	single, err := (TPMKeys{TPM: chip, PCRs: pcrs, Expected: onB, Other: func() map[int][]byte { return nil }}).Seal(nuk)
	if err != nil {
		t.Fatal(err)
	}
	if Alternatives(single) != 1 {
		t.Fatalf("resealed blob holds %d alternatives", Alternatives(single))
	}
	boot(rootA)
	if _, err := (TPMKeys{TPM: chip}).Unseal(single); err == nil {
		t.Error("the old image opens a key resealed after the update was confirmed")
	}
	boot(rootB)
	if got, err := (TPMKeys{TPM: chip}).Unseal(single); err != nil || !bytes.Equal(got, nuk) {
		t.Errorf("the new image cannot open its key: %v", err)
	}
}

func TestSplitAlternatives(t *testing.T) {
	plain := []byte("PLTPMSL1 whatever")
	if bs, err := splitAlternatives(plain); err != nil || len(bs) != 1 || !bytes.Equal(bs[0], plain) {
		t.Fatalf("plain blob: %v %q", err, bs)
	}
	two := marshalAlternatives([][]byte{[]byte("one"), []byte("second")})
	if bs, err := splitAlternatives(two); err != nil || len(bs) != 2 || string(bs[1]) != "second" {
		t.Fatalf("two: %v %q", err, bs)
	}
	for _, bad := range [][]byte{
		[]byte(altMagic), append([]byte(altMagic), 0), append([]byte(altMagic), 9),
		two[:len(two)-1], append(two, 0), append([]byte(altMagic), 1, 0, 0, 0, 0),
	} {
		if _, err := splitAlternatives(bad); err == nil {
			t.Errorf("accepted %q", bad)
		}
		if Alternatives(bad) != 0 {
			t.Errorf("Alternatives(%q) != 0", bad)
		}
	}
}
