package vmtest

import (
	"context"
	"os"
	"testing"

	"plinth.dev/plinth/platform/gpt"
)

// diskBoot makes a boot of m go through OVMF from m.disk (flashed from the
// image's disk.img by flashMachine) instead of -kernel and fw_cfg.
func diskBoot(m *machine) func(*NodeOptions) {
	return func(o *NodeOptions) {
		o.Kernel, o.Initramfs, o.Cmdline, o.FwCfg = "", "", "", nil
		o.UEFI = &UEFI{Vars: m.dir + "/OVMF_VARS.fd"}
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
// disk's end), bootstraps, and a second boot continues (boot count 2).
func TestDiskBoot(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 3*bootTimeout)
	defer cancel()
	m := newMachine(t, BootstrapParameters())
	const size = 3 << 30
	flashMachine(t, m, size)

	n := m.boot(t, ctx, "boot1", diskBoot(m))
	mustLine(t, ctx, n, `I init: map and mount the system image \(dm-verity\) detail=.*\(slot a\)`)
	mustLine(t, ctx, n, `I init: read node parameters detail="?from esp`)
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

	n = m.boot(t, ctx, "boot2", diskBoot(m))
	mustLine(t, ctx, n, `I init: storage: unseal node unlock key`)
	wantBootCount(t, ctx, n, "2")
	assertNoLine(t, n, `make ext4 filesystem`)
	powerOff(t, ctx, n)
}
