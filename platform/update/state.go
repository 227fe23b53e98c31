// Package update is the A/B update of a node booted from a flashed disk:
// the state it keeps in a UEFI variable, what a boot decides from it, the
// PCR values the new slot will measure, writing the inactive slot and the
// firmware boot entries that boot it once and then for good.
//
//	running slot a                           firmware           new slot b
//	─────────────────────────────────────────────────────────────────────────────
//	Pending{writing a→b}        (var)
//	system.img ─► partition b, sha256 + verity root hash checked
//	UKI        ─► ESP EFI/plinth/b.efi, sha256 checked
//	predict b's PCRs 4, 11, 15 from the UKI and this boot's event log
//	reseal: node unlock key, join state ─► {a's PCRs} ∪ {b's PCRs}
//	Pending{staged a→b}: a staged update waits here (reboots keep slot a);
//	Cancel: BootNext cleared, var cleared, reseal to a only
//	Activate: entry "Plinth b", BootNext = it, Pending{ready a→b}
//	reboot ───────────────────────────────► BootNext: b.efi once
//	                                                           ─► Pending{ready, to b}: trial
//	                                                           unseal (b's PCRs), join, HEALTHY
//	                                                           ─► BootOrder: "Plinth b" first
//	                                                           reseal to b only, var cleared
//	reset before that (crash, halt, watchdog, no unseal) ────► BootOrder: slot a again
//	─► Pending{ready, to b} on slot a: failed update recorded, reseal to a only
//
// Why the state is a UEFI variable and not a file: the firmware writes a
// variable whole or not at all, /init reads it before anything is unsealed
// or mounted (it decides how this boot goes), and it lives next to
// BootNext/BootOrder, which it describes. Whoever has the machine in
// their hands can write it, so it decides nothing a key depends on: the
// PCR values the keys are sealed to while an update is pending live on
// the encrypted data volume (sealsets.go). A forged variable can make
// the node report a false failure, drop the other slot's seal early or
// boot its other slot once (which then has no keys to open); the node
// boots its current slot whatever the variable holds.
package update

import (
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"plinth.dev/plinth/platform/efivar"
)

// VendorGUID is the vendor of Plinth's UEFI variables. Generated once at
// random; it must never change.
const VendorGUID = "253dfe58-23b8-47e5-9fbe-dfb5d0175e8f"

// VarName is the variable holding State.
const VarName = "PlinthUpdate"

// varAttributes: kept across reboots, readable by the OS.
const varAttributes = efivar.NonVolatile | efivar.BootServiceAccess | efivar.RuntimeAccess

// Phase is how far a pending update got.
type Phase string

const (
	// PhaseWriting: the inactive slot is being written. Nothing boots it.
	PhaseWriting Phase = "writing"
	// PhaseStaged: the slot is written and checked, the keys sealed to
	// its PCRs too, but the firmware is not told to boot it: the update
	// waits for Activate (or Cancel). A reboot meanwhile runs the old
	// slot and keeps it staged.
	PhaseStaged Phase = "staged"
	// PhaseReady: the slot is written and checked, the keys sealed to its
	// PCRs too, BootNext names it: the next boot tries it once.
	PhaseReady Phase = "ready"
)

func (p Phase) valid() bool { return p == PhaseWriting || p == PhaseStaged || p == PhaseReady }

// Pending is an update in progress.
type Pending struct {
	Phase   Phase  `json:"phase"`
	From    string `json:"from"` // the slot that was running
	To      string `json:"to"`   // the slot being installed
	Version string `json:"version"`
	// Started is when the update began, Unix seconds.
	Started int64 `json:"started"`
}

// Failure is an update that did not complete.
type Failure struct {
	Version string `json:"version"`
	Slot    string `json:"slot"`
	Reason  string `json:"reason"`
	// Time is when the failure was found, Unix seconds.
	Time int64 `json:"time"`
}

// State is what the variable holds.
type State struct {
	Pending    *Pending `json:"pending,omitempty"`
	LastFailed *Failure `json:"last_failed,omitempty"`
	// LastVersion is the version the last completed update installed.
	LastVersion string `json:"last_version,omitempty"`
}

// ErrCorruptState: the variable exists and is not a State. Read returns it
// with an empty State, which the boot treats as no update pending (and
// reports).
var ErrCorruptState = errors.New("update: the update state variable is corrupt")

// maxState bounds the variable (the firmware's store is small).
const maxState = 4096

// Read returns the state (empty if the variable does not exist).
func Read(s efivar.Store) (State, error) {
	_, data, err := s.Read(VarName, VendorGUID)
	if errors.Is(err, efivar.ErrNotFound) {
		return State{}, nil
	}
	if err != nil {
		return State{}, err
	}
	var st State
	if err := json.Unmarshal(data, &st); err != nil {
		return State{}, fmt.Errorf("%w: %v", ErrCorruptState, err)
	}
	if p := st.Pending; p != nil && (!validSlot(p.From) || !validSlot(p.To) || p.From == p.To || !p.Phase.valid()) {
		return State{}, fmt.Errorf("%w: pending update %+v", ErrCorruptState, *p)
	}
	return st, nil
}

// Write stores st (deleting the variable when st is empty).
func Write(s efivar.Store, st State) error {
	if st == (State{}) {
		if err := s.Delete(VarName, VendorGUID); err != nil && !errors.Is(err, efivar.ErrNotFound) {
			return err
		}
		return nil
	}
	data, err := json.Marshal(st)
	if err != nil {
		return err
	}
	if len(data) > maxState {
		return fmt.Errorf("update: state of %d bytes, at most %d", len(data), maxState)
	}
	return s.Write(VarName, VendorGUID, varAttributes, data)
}

func validSlot(s string) bool { return s == "a" || s == "b" }

// Other returns the slot that is not s.
func Other(s string) string {
	if s == "a" {
		return "b"
	}
	return "a"
}

// Boot is what this boot is, given the state found at its start.
type Boot int

const (
	// BootNormal: no update involves this boot.
	BootNormal Boot = iota
	// BootTrial: this boot runs the slot a ready update installed, once;
	// it confirms the update when the node is healthy, and on failure it
	// resets, which boots the old slot.
	BootTrial
	// BootRolledBack: an update did not complete; this boot runs the old
	// slot and has recorded the failure.
	BootRolledBack
)

func (b Boot) String() string {
	return [...]string{"normal", "trial", "rolled back"}[b]
}

// Settle decides what this boot is from the state st found at its start
// and the slot it runs, and returns the state to store. It is the whole
// state machine of a node's side of an update, each crash point included:
//
//	found                         running   boot        stored
//	none                          any       normal      unchanged
//	writing  a→b                  a         rolled back failure "interrupted while writing", no pending
//	staged   a→b                  a         normal      unchanged (Activate or Cancel ends it)
//	ready    a→b                  b         trial       unchanged (Confirm or a reset ends it)
//	staged   a→b                  b         trial       (an old "Plinth b" entry booted it: sealed for it, so on trial)
//	ready    a→b                  a         rolled back failure "b did not become healthy", no pending
//	writing  a→b                  b         rolled back (b is never booted while writing)
//
// A boot with no slot (network boot) never has a pending update, but a
// stale one (the node was re-flashed or network-booted meanwhile) is
// cleared as a failure.
func Settle(st State, running string, now time.Time) (State, Boot) {
	p := st.Pending
	if p == nil {
		return st, BootNormal
	}
	switch {
	case p.Phase != PhaseWriting && running == p.To:
		return st, BootTrial
	case p.Phase == PhaseStaged && running == p.From:
		return st, BootNormal
	}
	reason := fmt.Sprintf("slot %s (version %s) was booted once and did not confirm: it crashed, hung, halted or could not unseal its keys before it was healthy; slot %s runs again", p.To, p.Version, p.From)
	switch {
	case p.Phase == PhaseWriting:
		reason = fmt.Sprintf("the update to version %s was interrupted while slot %s was written (power cut or crash); slot %s kept running", p.Version, p.To, p.From)
	case running != p.From:
		reason = fmt.Sprintf("the update to version %s (slot %s) was pending, but this boot runs %q", p.Version, p.To, running)
	}
	return State{LastFailed: &Failure{Version: p.Version, Slot: p.To, Reason: reason, Time: now.Unix()}, LastVersion: st.LastVersion}, BootRolledBack
}

// Confirm returns the state after the trial boot of st's pending update
// became healthy.
func Confirm(st State) State {
	if st.Pending == nil {
		return st
	}
	return State{LastVersion: st.Pending.Version, LastFailed: st.LastFailed}
}
