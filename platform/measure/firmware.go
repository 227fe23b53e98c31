package measure

import (
	"errors"
	"fmt"
	"strings"
)

// What the firmware measured.
//
// Under UEFI with the UKI, firmware extends the UKI's Authenticode digest
// into PCR 4 and systemd-stub the UKI's sections (kernel, initramfs,
// command line with the system image's root hash) into PCR 11, so a key
// sealed to PCRs 4, 11 and 15 opens only for this image. Under QEMU's
// direct kernel boot (SeaBIOS), PCRs 0-11 are the same whatever kernel
// and initramfs boot: whoever can boot their own initramfs on the machine
// can extend PCR 15 with the known values and unseal. Such a boot is
// "unmeasured": the node says so, and with the TPM required it creates no
// new sealed key unless its parameters allow it (development, tests).

// Firmware is what this boot's firmware and UKI stub measured, as /init
// finds it.
type Firmware struct {
	// UEFI: the kernel was started by UEFI firmware.
	UEFI bool
	// StubPCR11: systemd-stub measured the UKI's sections into PCR 11 (its
	// StubPcrKernelImage EFI variable says 11).
	StubPCR11 bool
	// BootApps is how many boot applications (the UKI, the kernel it
	// starts) the firmware's event log shows measured into PCR 4.
	BootApps int
}

// Measured reports whether firmware and stub measured this boot's UKI.
func (f Firmware) Measured() bool { return f.UEFI && f.StubPCR11 && f.BootApps > 0 }

// Gap says what was not measured, "" for a measured boot.
func (f Firmware) Gap() string {
	var gaps []string
	switch {
	case !f.UEFI:
		return "not booted by UEFI firmware (e.g. QEMU -kernel): PCRs 4 and 11 do not cover the kernel, initramfs and command line"
	case !f.StubPCR11:
		gaps = append(gaps, "no UKI stub measured the kernel, initramfs and command line into PCR 11")
	}
	if f.UEFI && f.BootApps == 0 {
		gaps = append(gaps, "the firmware's event log shows no boot application measured into PCR 4")
	}
	return strings.Join(gaps, "; ")
}

// ErrUnmeasuredBoot: a new sealed key was refused because this boot was
// not measured and the node parameters do not allow that.
var ErrUnmeasuredBoot = errors.New("unmeasured boot")

// unmeasuredError explains a refusal.
func unmeasuredError(gap string) error {
	return fmt.Errorf("%w: %s; refusing to seal a new node unlock key, which would bind the disk to nothing but this machine's TPM (boot the node through its UKI, or set tpm.allow_unmeasured_boot in the node parameters for development)", ErrUnmeasuredBoot, gap)
}
