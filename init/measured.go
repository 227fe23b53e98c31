package main

import (
	"bytes"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"time"

	"golang.org/x/sys/unix"

	"plinth.dev/plinth/api/clusterpb"
	"plinth.dev/plinth/platform/bootdisk"
	"plinth.dev/plinth/platform/eventlog"
	"plinth.dev/plinth/platform/measure"
	"plinth.dev/plinth/platform/tpm"
	"plinth.dev/plinth/platform/update"
)

// What the firmware measured this boot, and whether the live PCRs are
// what the UKI predicts:
//
//	efivarfs: StubPcrKernelImage = 11 ──┐
//	securityfs: the firmware event log ─┴─► measure.Firmware (measured or not, and why)
//	the UKI on the ESP (LoaderImageIdentifier) ──► predicted PCR 11, PCR 4 (log replayed) ──► console

// securityFS is where the kernel's TPM event log is.
const securityFS = "/sys/kernel/security"

// firmwareMeasurements finds what the firmware and stub measured, and the
// firmware's event log (nil without one).
func firmwareMeasurements() (measure.Firmware, []eventlog.Event) {
	f := measure.Firmware{UEFI: bootdisk.UEFI()}
	if !f.UEFI {
		return f, nil
	}
	if v, _ := bootdisk.LoaderVar(bootdisk.EFIVarsDir, "StubPcrKernelImage"); v == "11" {
		f.StubPCR11 = true
	}
	if _, err := os.Stat(eventlog.DefaultPath); errors.Is(err, os.ErrNotExist) {
		unix.Mount("securityfs", securityFS, "securityfs", unix.MS_NOSUID|unix.MS_NODEV|unix.MS_NOEXEC, "")
	}
	events, err := eventlog.Read(eventlog.DefaultPath)
	if err != nil {
		return f, nil
	}
	f.BootApps = len(eventlog.Applications(events))
	return f, events
}

// unmeasuredProblem is the node status entry of an unmeasured boot.
func unmeasuredProblem(f measure.Firmware) []*clusterpb.NodeProblem {
	if f.Measured() {
		return nil
	}
	return []*clusterpb.NodeProblem{{Component: "measured-boot", Message: "unmeasured boot: " + f.Gap(), SinceUnixNanos: time.Now().UnixNano()}}
}

// checkPredictions compares the live PCRs 4 and 11 with what the UKI the
// firmware started predicts: PCR 11 from its sections, PCR 4 from this
// boot's event log replayed with its Authenticode digest and its kernel's.
// These are the predictions an update seals to before it switches slots,
// so a mismatch is logged loudly. It reads the UKI from the boot disk's
// ESP; it runs beside the boot, which does not wait for it.
func checkPredictions(l *slog.Logger, chip *tpm.TPM, boot *bootdisk.Boot, events []eventlog.Event) {
	if chip == nil || boot == nil || events == nil {
		return
	}
	img, name, err := readBootUKI(boot)
	if err != nil {
		l.Warn("measured boot: cannot check the PCR predictions", "err", err)
		return
	}
	u, err := update.ReadUKI(img)
	if err != nil {
		l.Warn("measured boot: cannot predict the PCRs of the UKI", "uki", name, "err", err)
		return
	}
	pcr11 := u.PCR11
	pcr4, err4 := eventlog.PredictPCR4(events, u.Apps)
	live, err := chip.ReadPCRs([]int{4, 11})
	if err != nil {
		l.Warn("measured boot: cannot read PCRs", "err", err)
		return
	}
	match := func(pred []byte, pcr int) string {
		if pred != nil && bytes.Equal(pred, live[pcr]) {
			return "match"
		}
		return fmt.Sprintf("MISMATCH (predicted %x)", pred)
	}
	msg := fmt.Sprintf("PCR 4 %x: %s; PCR 11 %x: %s", live[4], match(pcr4, 4), live[11], match(pcr11, 11))
	if err4 != nil {
		msg = fmt.Sprintf("PCR 4 %x: not predicted (%v); PCR 11 %x: %s", live[4], err4, live[11], match(pcr11, 11))
	}
	if err4 != nil || !bytes.Equal(pcr4, live[4]) || !bytes.Equal(pcr11, live[11]) {
		l.Error("measured boot: live PCRs differ from the UKI's predictions", "uki", name, "detail", msg)
		return
	}
	l.Info("measured boot: live PCRs equal the UKI's predictions", "uki", name, "detail", msg)
}

// readBootUKI reads the UKI the firmware started (the stub's
// LoaderImageIdentifier, a path on the boot disk's ESP).
func readBootUKI(boot *bootdisk.Boot) ([]byte, string, error) {
	id, err := bootdisk.LoaderVar(bootdisk.EFIVarsDir, "LoaderImageIdentifier")
	if err != nil || id == "" {
		return nil, "", fmt.Errorf("the stub did not say which file it was loaded from (LoaderImageIdentifier): %v", err)
	}
	name := strings.TrimLeft(strings.ReplaceAll(id, `\`, "/"), "/")
	dir := filepath.Join("/run/plinth", "esp-uki")
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, "", err
	}
	if err := unix.Mount(boot.ESPDevice(), dir, "vfat", unix.MS_RDONLY|unix.MS_NOSUID|unix.MS_NODEV|unix.MS_NOEXEC, ""); err != nil {
		return nil, "", fmt.Errorf("mounting the ESP %s: %w", boot.ESPDevice(), err)
	}
	defer unix.Unmount(dir, 0)
	// FAT is case-insensitive; the kernel's vfat matches case-insensitively too.
	img, err := os.ReadFile(filepath.Join(dir, name))
	return img, name, err
}
