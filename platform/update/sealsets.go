package update

import (
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
)

// What the keys are sealed to while an update is pending lives on the
// encrypted data volume, not in the UEFI variable:
//
//	Install  ─► PCRSets file {from, to, version, started; PCR values by slot}
//	Other    ◄─ the file, if it names the variable's pending update;
//	            otherwise nothing (the variable alone is a hint)
//
// Why: every key this boot seals also opens with the values Other
// returns. The variable can be written by whoever has the machine in
// their hands (boot another OS, write PlinthUpdate, put the node back):
// values taken from it would let that OS open every key sealed
// afterwards. The data volume is opened only with the node unlock key,
// which the TPM releases only to a boot of this node's own slots.
// Guarded by TestForgedVariableSealsNothingExtra (a real TPM simulator).

// pcrRecord is the PCRSets file: the pending update it belongs to, and
// the PCR values (hex) each slot's boot measures.
type pcrRecord struct {
	From    string                    `json:"from"`
	To      string                    `json:"to"`
	Version string                    `json:"version"`
	Started int64                     `json:"started"`
	PCRs    map[string]map[int]string `json:"pcrs"`
}

func (r pcrRecord) of(p *Pending) bool {
	return r.From == p.From && r.To == p.To && r.Version == p.Version && r.Started == p.Started
}

// keepPCRs writes the PCR values of p's two slots to the PCRSets file.
func (n *Node) keepPCRs(p *Pending, sets map[string]map[int][]byte) error {
	if n.PCRSets == "" {
		return errors.New("update: no file on the data volume to keep the new slot's PCR values in")
	}
	r := pcrRecord{From: p.From, To: p.To, Version: p.Version, Started: p.Started, PCRs: map[string]map[int]string{}}
	for slot, v := range sets {
		r.PCRs[slot] = hexPCRs(v)
	}
	b, err := json.Marshal(r)
	if err != nil {
		return err
	}
	return writeFileAtomic(n.PCRSets, b)
}

// dropPCRs removes the PCRSets file (no update pending any more).
func (n *Node) dropPCRs() {
	if n.PCRSets == "" {
		return
	}
	if err := os.Remove(n.PCRSets); err != nil && !errors.Is(err, fs.ErrNotExist) {
		n.Log.Warn("update: removing the pending update's PCR values", "err", err)
	}
}

// keptPCRs reads the PCR values the PCRSets file holds for slot of
// pending update p: nil if there is no file (the data volume is not
// open yet, or was never told of p), or it belongs to another update,
// or is malformed; the last two are logged.
func (n *Node) keptPCRs(p *Pending, slot string) map[int][]byte {
	if n.PCRSets == "" {
		return nil
	}
	b, err := os.ReadFile(n.PCRSets)
	if errors.Is(err, fs.ErrNotExist) {
		return nil
	}
	var r pcrRecord
	if err == nil {
		err = json.Unmarshal(b, &r)
	}
	if err == nil && !r.of(p) {
		err = fmt.Errorf("they belong to the update to %s (slot %s, started %d), the variable names %s (slot %s, started %d)",
			r.Version, r.To, r.Started, p.Version, p.To, p.Started)
	}
	out := map[int][]byte{}
	for k, v := range r.PCRs[slot] {
		if err != nil {
			break
		}
		out[k], err = hex.DecodeString(v)
	}
	if err == nil && len(out) == 0 {
		err = fmt.Errorf("they hold none for slot %s", slot)
	}
	if err != nil {
		n.Log.Warn("update: the pending update's PCR values on the data volume are not used; keys are sealed to this boot alone", "err", err)
		return nil
	}
	return out
}
