//go:build built

package vmtest

import (
	"context"
	"crypto/sha256"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"testing"
	"time"

	"plinth.dev/plinth/image"
	"plinth.dev/plinth/launch"
	"plinth.dev/plinth/platform/gpt"
	"plinth.dev/plinth/platform/layout"
)

// diskBoot makes a boot of m go through OVMF from m.disk (flashed from the
// image's disk.img by flashMachine) instead of -kernel and fw_cfg.
func diskBoot(m *machine) func(*launch.NodeOptions) {
	return func(o *launch.NodeOptions) {
		o.Kernel, o.Initramfs, o.Cmdline, o.FwCfg = "", "", "", nil
		o.UEFI = &launch.UEFI{Vars: m.dir + "/OVMF_VARS.fd"}
	}
}

// flashMachine writes the image's disk.img onto m's disk file, grown to
// size, with m's parameters on the ESP.
func flashMachine(t *testing.T, m *machine, size int64) {
	t.Helper()
	if err := m.img.FlashDisk(m.disk, size, m.params); err != nil {
		t.Fatal(err)
	}
}

// TestDiskBoot: disk.img, flashed onto a larger disk with the parameters on
// its ESP, boots under OVMF with a TPM: the system image comes from slot a,
// the parameters from the ESP, the node adds its data partition in the
// free space as entry 4 (entries 1-3 untouched, backup table moved to the
// disk's end), bootstraps with a key sealed to what firmware and stub
// measured (PCR 11 as the manifest predicts, PCR 4 as the node predicts
// from its event log). A UKI with another command line cannot unseal and
// leaves the data alone; the original UKI back, the node continues
// (boot count 2). A corrupt system slot is refused, the data untouched.
func TestDiskBoot(t *testing.T) {
	parallel(t, 110*time.Second) // with TestNetBoot: see there
	ctx, cancel := context.WithTimeout(context.Background(), 4*bootTimeout)
	defer cancel()
	p := launch.BootstrapParameters()
	p.Tpm.AllowUnmeasuredBoot = false // measured: the node needs no exception
	m := newMachine(t, p)
	const size = 3 << 30
	flashMachine(t, m, size)

	n := m.boot(t, ctx, "boot1", diskBoot(m))
	mustLine(t, ctx, n, `I init: map and mount the system image \(dm-verity\) detail=.*\(slot a\)`)
	mustLine(t, ctx, n, `I init: read node parameters detail="?from esp`)
	mustLine(t, ctx, n, `I init: TPM and measured boot detail=.*firmware measured the UKI`)
	// PCR 11 is what the builder predicted for slot a's UKI; PCR 4 what
	// the node predicts by replaying its event log with the UKI's digests.
	pcrs := mustLine(t, ctx, n, `I init: measured boot: live PCRs equal the UKI's predictions uki=EFI/BOOT/BOOTX64.EFI detail="PCR 4 ([0-9a-f]{64}): match; PCR 11 ([0-9a-f]{64}): match"`)
	if want := m.img.Manifest.UKIs[image.UKISlotFile("a")].PCR11; pcrs[2] != want {
		t.Errorf("PCR 11 %s, the manifest predicts %s", pcrs[2], want)
	}
	mustLine(t, ctx, n, `I init: storage: mark setup complete`)
	wantBootCount(t, ctx, n, "1")
	mustLine(t, ctx, n, `I init: node ready`)
	powerOff(t, ctx, n)

	f, err := os.Open(m.disk)
	if err != nil {
		t.Fatal(err)
	}
	table, err := gpt.Read(f, size)
	f.Close()
	if err != nil {
		t.Fatal(err)
	}
	if len(table.Partitions) != 4 || table.NeedsRepair() {
		t.Fatalf("table after the first boot: %+v", table)
	}
	for i, want := range m.img.Manifest.Disk.Partitions {
		p := table.Partitions[i]
		if p.Number != want.Number || p.ID.String() != want.GUID || p.FirstLBA != want.FirstLBA || p.LastLBA != want.LastLBA || p.Name != want.Name {
			t.Errorf("entry %d changed: %+v, image had %+v", want.Number, p, want)
		}
	}
	data := table.Partitions[3]
	_, last, _ := gpt.UsableRange(size)
	if data.Number != 4 || data.FirstLBA != m.img.Manifest.Disk.Partitions[2].LastLBA+1 || last-data.LastLBA >= gpt.Alignment {
		t.Errorf("data partition %+v does not fill the free space (usable up to LBA %d)", data, last)
	}
	if data.Name != "plinth-data" {
		t.Errorf("entry 4 is %q", data.Name)
	}

	// The attack: the same kernel, initramfs and system image, booted from
	// a UKI with another command line. /init extends PCR 15 with exactly
	// the expected values (same parameters, same root hash), but firmware
	// (PCR 4) and stub (PCR 11) measured another UKI: no unseal, and the
	// data partition is not touched.
	espOffset := int64(m.img.Manifest.Disk.Partitions[0].FirstLBA) * 512
	original := filepath.Join(m.img.Dir, image.UKISlotFile("a"))
	other := filepath.Join(m.dir, "other.efi")
	writeUKIWithCmdline(t, original, other, func(c string) string { return c + " plinth.other=1" })
	putOnESP(t, m.disk, espOffset, other, layout.ESPBootFile)
	dataBefore := hashRange(t, m.disk, data.Offset(), data.Size())
	n = m.boot(t, ctx, "boot2-other-uki", diskBoot(m))
	t.Logf("refused as expected: %s", mustLine(t, ctx, n, `E init: boot step failed: open data disk err=.*cannot unseal.*PCRs? (4|11)\b.*`)[0])
	mustLine(t, ctx, n, `E init: node halted`)
	powerOff(t, ctx, n)
	if hashRange(t, m.disk, data.Offset(), data.Size()) != dataBefore {
		t.Fatal("the data partition changed although its key could not be unsealed")
	}

	// The original UKI back: the node continues where it was (the refused
	// boot counted nothing).
	putOnESP(t, m.disk, espOffset, original, layout.ESPBootFile)
	n = m.boot(t, ctx, "boot3-original", diskBoot(m))
	mustLine(t, ctx, n, `I init: storage: unseal node unlock key`)
	wantBootCount(t, ctx, n, "2")
	assertNoLine(t, n, `make ext4 filesystem`)
	powerOff(t, ctx, n)

	// A corrupt system slot: dm-verity refuses the block the mount reads,
	// the node says so and halts before it opens anything else; the data
	// partition stays as it was.
	slotA := m.img.Manifest.Disk.Partitions[1]
	corruptByte(t, m.disk, int64(slotA.FirstLBA)*512+100)
	dataBefore = hashRange(t, m.disk, data.Offset(), data.Size())
	n = m.boot(t, ctx, "boot4-corrupt-slot", diskBoot(m))
	mustLine(t, ctx, n, `E init: boot step failed: map and mount the system image \(dm-verity\) err=".*system image in slot a does not match its root hash.*reading block 0\b`)
	mustLine(t, ctx, n, `E init: node halted`)
	powerOff(t, ctx, n)
	if hashRange(t, m.disk, data.Offset(), data.Size()) != dataBefore {
		t.Fatal("the data partition changed on a boot from a corrupt system slot")
	}
}

// corruptByte flips the low bit of the byte at offset of file.
func corruptByte(t *testing.T, file string, offset int64) {
	t.Helper()
	f, err := os.OpenFile(file, os.O_RDWR, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	b := make([]byte, 1)
	if _, err := f.ReadAt(b, offset); err != nil {
		t.Fatal(err)
	}
	b[0] ^= 1
	if _, err := f.WriteAt(b, offset); err != nil {
		t.Fatal(err)
	}
}

// writeUKIWithCmdline writes to out the UKI in as rebuilt with its command
// line changed by edit (everything else the same).
func writeUKIWithCmdline(t *testing.T, in, out string, edit func(string) string) {
	t.Helper()
	if _, err := image.RebuildUKI(in, "", out, edit); err != nil {
		t.Fatal(err)
	}
}

// putOnESP replaces the file at path on the ESP at offset of disk.
func putOnESP(t *testing.T, disk string, offset int64, file, path string) {
	t.Helper()
	cmd := exec.Command("mcopy", "-o", "-i", fmt.Sprintf("%s@@%d", disk, offset), file, "::"+path)
	cmd.Env = append(os.Environ(), "MTOOLS_SKIP_CHECK=1")
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("mcopy: %v: %s", err, out)
	}
}

// hashRange hashes size bytes of file at offset.
func hashRange(t *testing.T, file string, offset, size int64) [32]byte {
	t.Helper()
	f, err := os.Open(file)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	h := sha256.New()
	if _, err := io.Copy(h, io.NewSectionReader(f, offset, size)); err != nil {
		t.Fatal(err)
	}
	var s [32]byte
	copy(s[:], h.Sum(nil))
	return s
}
