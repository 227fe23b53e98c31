package update

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"log/slog"
	"path/filepath"
	"strconv"
	"testing"
	"time"

	"github.com/google/go-tpm-tools/simulator"
	"github.com/google/go-tpm/tpm2/transport"

	"plinth.dev/plinth/platform/efivar"
	"plinth.dev/plinth/platform/measure"
	"plinth.dev/plinth/platform/tpm"
)

// TestForgedVariableSealsNothingExtra attacks the seal as someone with
// the machine in their hands would, on a real TPM (the reference
// simulator): they booted their own OS, recorded what it measures into
// PCR 15 (here: this boot's PCRs with one more event) and wrote a
// PlinthUpdate variable naming a staged update with those values. The
// node still boots its current slot; a key it seals afterwards opens
// with this boot's PCRs and not with theirs. The same values kept on the
// data volume for the same update (what an update this node installed
// writes there) do open it: what the attack lacks is the data volume.
func TestForgedVariableSealsNothingExtra(t *testing.T) {
	sim, err := simulator.GetWithFixedSeedInsecure(1)
	if err != nil {
		t.Fatal(err)
	}
	chip := tpm.New(transport.FromReadWriteCloser(sim), "simulator")
	t.Cleanup(func() { chip.Close() })
	if err := measure.Boot(chip, sha256.Sum256([]byte("parameters")), bytes.Repeat([]byte{0xab}, 32)); err != nil {
		t.Fatal(err)
	}
	pcrs := measure.DefaultSealPCRs
	current, err := chip.ReadPCRs(pcrs)
	if err != nil {
		t.Fatal(err)
	}
	// The attacker's OS: PCR 15 with one more event.
	evil := []byte("the attacker's own OS")
	d := sha256.Sum256(evil)
	v := sha256.Sum256(append(bytes.Clone(current[measure.PCR]), d[:]...))
	forged := map[int][]byte{}
	forgedHex := map[string]string{}
	for _, p := range pcrs {
		forged[p] = current[p]
		if p == measure.PCR {
			forged[p] = v[:]
		}
		forgedHex[strconv.Itoa(p)] = hex.EncodeToString(forged[p])
	}

	dir := t.TempDir()
	store := efivar.Store{Dir: dir}
	variable, _ := json.Marshal(map[string]any{"pending": map[string]any{"phase": "staged", "from": "a", "to": "b", "version": "v9", "started": 1,
		"pcrs": map[string]any{"b": forgedHex}}})
	if err := store.Write(VarName, VendorGUID, varAttributes, variable); err != nil {
		t.Fatal(err)
	}
	n := &Node{Running: "a", Store: store, Log: slog.New(slog.DiscardHandler), PCRSets: filepath.Join(dir, "data", "update-pcrs")}
	if boot, failed, err := n.Start(time.Now()); err != nil || boot != BootNormal || failed != nil {
		t.Fatalf("boot with the forged variable: %v, %v, %v; want a normal boot of slot a", boot, failed, err)
	}
	keys := measure.TPMKeys{TPM: chip, PCRs: pcrs, Expected: current, Other: n.Other}
	secret := bytes.Repeat([]byte{7}, 32)
	blob, err := keys.Seal(secret)
	if err != nil {
		t.Fatal(err)
	}
	if k := measure.Alternatives(blob); k != 1 {
		t.Errorf("sealed to %d PCR sets, want this boot's alone", k)
	}
	// The same values on the data volume, for this update: the control.
	if err := n.keepPCRs(n.state.Pending, map[string]map[int][]byte{"a": current, "b": forged}); err != nil {
		t.Fatal(err)
	}
	kept, err := keys.Seal(secret)
	if err != nil {
		t.Fatal(err)
	}

	if err := chip.Extend(measure.PCR, evil); err != nil {
		t.Fatal(err)
	}
	if now, _ := chip.ReadPCRs([]int{measure.PCR}); !bytes.Equal(now[measure.PCR], forged[measure.PCR]) {
		t.Fatalf("PCR %d = %x, the attacker's OS measures %x", measure.PCR, now[measure.PCR], forged[measure.PCR])
	}
	if _, err := keys.Unseal(blob); err == nil {
		t.Fatal("the key sealed after the forged variable opens under the attacker's PCR values")
	}
	if got, err := keys.Unseal(kept); err != nil || !bytes.Equal(got, secret) {
		t.Fatalf("the key sealed with the data volume's values does not open with them: %v", err)
	}
}
