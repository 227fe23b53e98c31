// Package measure is the node's measured boot: what /init extends into the
// TPM before it unseals anything, and the lock it extends afterwards.
//
//	firmware ─► PCR 0..7     UKI stub ─► PCR 11    (disk/UKI boot)
//	                         UKI stub ─► PCR 12    only a command line given as
//	                                               load options (stays zero)
//	/init    ─► PCR 15 ◄─ sha256("plinth.parameters:" ‖ sha256(parameters))
//	              ◄─ sha256("plinth.system-image:" ‖ verity root hash)
//	         unseal node unlock key (policy: PCRs 4, 7, 11, 12, 15)
//	/init    ─► PCR 15 ◄─ sha256("plinth.sealed-keys-released")   no second unseal this boot
//
// PCR 15 is free for the OS by the TCG PC client profile and is what
// systemd also uses for system identity. Changing the parameters or the
// system image changes PCR 15, so the disk key stays sealed.
package measure

import (
	"crypto/sha256"
	"errors"
	"fmt"
	"slices"

	"plinth.dev/plinth/platform/tpm"
)

// PCR is the register /init measures into.
const PCR = 15

// DefaultSealPCRs is the default policy: UKI as measured by firmware (4),
// Secure Boot state (7), UKI sections as measured by systemd-stub (11), a
// command line given to the stub instead of the UKI's own (12) and /init's
// own measurements (15).
//
// Why 12: without Secure Boot, systemd-stub 252 boots the UKI's kernel
// with a command line passed as load options (a boot entry's optional
// data, the EFI shell) instead of its .cmdline section, and measures that
// into PCR 12 only; PCRs 4 and 11 stay the same. Without 12 in the policy,
// the genuine UKI booted with, say, a kernel debugger on the serial port
// would still unseal the disk key. Plinth's boots pass no load options, so
// PCR 12 is zero, and predictable.
var DefaultSealPCRs = []int{4, 7, 11, 12, 15}

// Event values extended into PCR. They are part of the sealing policy:
// changing them invalidates every sealed key.
func parametersEvent(digest [32]byte) []byte {
	return append([]byte("plinth.parameters:"), digest[:]...)
}

func systemImageEvent(rootHash []byte) []byte {
	return append([]byte("plinth.system-image:"), rootHash...)
}

var releasedEvent = []byte("plinth.sealed-keys-released")

// Boot extends PCR with the parameters and system image of this boot.
func Boot(t *tpm.TPM, parametersDigest [32]byte, rootHash []byte) error {
	if err := t.Extend(PCR, parametersEvent(parametersDigest)); err != nil {
		return fmt.Errorf("measuring parameters into PCR %d: %w", PCR, err)
	}
	if err := t.Extend(PCR, systemImageEvent(rootHash)); err != nil {
		return fmt.Errorf("measuring system image into PCR %d: %w", PCR, err)
	}
	return nil
}

// Lock extends PCR so that nothing later in this boot can unseal again.
func Lock(t *tpm.TPM) error {
	if err := t.Extend(PCR, releasedEvent); err != nil {
		return fmt.Errorf("locking sealed keys (PCR %d): %w", PCR, err)
	}
	return nil
}

// ExpectedPCR15 predicts PCR 15 after Boot, starting from zero: the
// builder can compute it for an image and a parameters document.
func ExpectedPCR15(parametersDigest [32]byte, rootHash []byte) []byte {
	v := make([]byte, 32)
	for _, ev := range [][]byte{parametersEvent(parametersDigest), systemImageEvent(rootHash)} {
		d := sha256.Sum256(ev)
		n := sha256.Sum256(append(v, d[:]...))
		v = n[:]
	}
	return v
}

// TPMKeys protects the node unlock key by sealing it in the TPM.
type TPMKeys struct {
	TPM  *tpm.TPM
	PCRs []int
	// Expected, if set, holds the values of PCRs as measured at boot,
	// before Lock: Seal binds to them instead of the current values, so a
	// key sealed later in the boot (after Lock changed PCR 15) still
	// unseals at the next boot.
	Expected map[int][]byte
	// Unmeasured, if set, says what the firmware did not measure this
	// boot (Firmware.Gap) and makes Seal refuse (ErrUnmeasuredBoot):
	// existing keys still unseal. "" when measured or allowed.
	Unmeasured string
	// Other, if set, returns the PCR values of the other slot's boot while
	// an A/B update is pending (nil otherwise): Seal then seals to both
	// sets, so that whichever slot boots next opens the key.
	Other func() map[int][]byte
}

// CanSeal reports whether Seal may create a key this boot, so that a
// caller refuses before it writes anything.
func (k TPMKeys) CanSeal() error {
	if k.Unmeasured != "" {
		return unmeasuredError(k.Unmeasured)
	}
	return nil
}

// Policy implements storage.KeyProtector.
func (k TPMKeys) Policy() string { return "tpm" }

// Seal implements storage.KeyProtector.
func (k TPMKeys) Seal(key []byte) ([]byte, error) {
	if err := k.CanSeal(); err != nil {
		return nil, err
	}
	pcrs := k.PCRs
	if len(pcrs) == 0 {
		pcrs = DefaultSealPCRs
	}
	if !slices.Contains(pcrs, PCR) {
		return nil, fmt.Errorf("seal PCR list %v lacks PCR %d: the key would not depend on the parameters and system image", pcrs, PCR)
	}
	var other map[int][]byte
	if k.Other != nil {
		other = k.Other()
	}
	if k.Expected == nil {
		if other != nil {
			return nil, errors.New("measure: sealing for a pending update needs this boot's PCR values")
		}
		return k.TPM.Seal(key, pcrs)
	}
	sets := []map[int][]byte{k.Expected}
	if other != nil {
		sets = append(sets, other)
	}
	var blobs [][]byte
	for i, set := range sets {
		want := make(map[int][]byte, len(pcrs))
		for _, p := range pcrs {
			v, ok := set[p]
			if !ok {
				return nil, fmt.Errorf("no value of PCR %d to seal to (PCR set %d)", p, i+1)
			}
			want[p] = v
		}
		b, err := k.TPM.SealTo(key, want)
		if err != nil {
			return nil, err
		}
		blobs = append(blobs, b)
	}
	if len(blobs) == 1 {
		return blobs[0], nil
	}
	return marshalAlternatives(blobs), nil
}

// Unseal implements storage.KeyProtector: a blob sealed for a pending
// update opens with either PCR set.
func (k TPMKeys) Unseal(blob []byte) ([]byte, error) { return unsealAny(blob, k.TPM.Unseal) }

// InsecureKeys keeps the node unlock key in the clear on the disk: only for
// development nodes whose parameters disable the TPM explicitly.
type InsecureKeys struct{}

// Policy implements storage.KeyProtector.
func (InsecureKeys) Policy() string { return "insecure-no-tpm" }

// Seal implements storage.KeyProtector.
func (InsecureKeys) Seal(key []byte) ([]byte, error) { return slices.Clone(key), nil }

// Unseal implements storage.KeyProtector.
func (InsecureKeys) Unseal(blob []byte) ([]byte, error) {
	if len(blob) != 32 {
		return nil, fmt.Errorf("stored development key has %d bytes, want 32", len(blob))
	}
	return slices.Clone(blob), nil
}
