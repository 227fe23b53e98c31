package image

import (
	"bytes"
	"encoding/hex"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"plinth.dev/plinth/platform/gpt"
	"plinth.dev/plinth/platform/layout"
	"plinth.dev/plinth/platform/uki"
)

// testNetbootArg is what the build test adds to the network-boot UKI.
const testNetbootArg = "plinth.parameters=dGVzdA"

// checkUKIs: each UKI carries the kernel, its command line and initramfs,
// and the manifest's predictions are those of the bytes on disk.
func checkUKIs(t *testing.T, out string, m *Manifest, kernel []byte) {
	t.Helper()
	initramfs, err := os.ReadFile(filepath.Join(out, InitramfsFile))
	if err != nil {
		t.Fatal(err)
	}
	off, size, err := SystemImageExtent(filepath.Join(out, InitramfsFile))
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		file, slot string
		whole      bool // the whole initramfs; else its second archive alone
	}{{UKIFile, "", true}, {UKISlotFile("a"), "a", false}, {UKISlotFile("b"), "b", false}} {
		info, ok := m.UKIs[c.file]
		if !ok {
			t.Errorf("manifest has no UKI %s", c.file)
			continue
		}
		img, err := os.ReadFile(filepath.Join(out, c.file))
		if err != nil {
			t.Fatal(err)
		}
		secs, err := uki.Read(img)
		if err != nil {
			t.Fatalf("%s: %v", c.file, err)
		}
		got := map[string][]byte{}
		for _, s := range secs {
			got[s.Name] = s.Data
		}
		wantCmdline := m.Cmdline
		if c.slot != "" {
			wantCmdline += " " + layout.SlotArg + "=" + c.slot
		} else {
			wantCmdline += " " + testNetbootArg
		}
		if string(got[uki.Cmdline]) != wantCmdline || info.Cmdline != wantCmdline || info.Slot != c.slot {
			t.Errorf("%s: command line %q (manifest %q, slot %q), want %q", c.file, got[uki.Cmdline], info.Cmdline, info.Slot, wantCmdline)
		}
		initrd := got[uki.Initrd]
		// The slot's initramfs is the compressed archive that follows the
		// system image's archive: a suffix, starting after the image.
		okInitrd := bytes.Equal(initrd, initramfs)
		if !c.whole {
			okInitrd = bytes.HasSuffix(initramfs, initrd) && int64(len(initrd)) < int64(len(initramfs))-off-size && len(initrd) > 1<<20
		}
		if !bytes.Equal(got[uki.Linux], kernel) || !okInitrd {
			t.Errorf("%s: .linux or .initrd is not the build's kernel and initramfs (%d of %d bytes)", c.file, len(initrd), len(initramfs))
		}
		if !bytes.Contains(got[uki.OSRel], []byte("VERSION_ID="+m.Version+"\n")) || string(got[uki.Uname]) != m.KernelVersion {
			t.Errorf("%s: .osrel %q, .uname %q", c.file, got[uki.OSRel], got[uki.Uname])
		}
		pcr, _ := uki.PredictPCR11(img)
		auth, _ := uki.AuthenticodeSHA256(img)
		if info.PCR11 != hex.EncodeToString(pcr) || info.Authenticode != hex.EncodeToString(auth) {
			t.Errorf("%s: manifest predictions %+v do not match the file", c.file, info)
		}
	}
	if m.UKIs[UKISlotFile("a")].PCR11 == m.UKIs[UKISlotFile("b")].PCR11 {
		t.Error("slots a and b have the same PCR 11: the slot is not measured")
	}
}

// checkDisk: disk.img is a valid GPT for sfdisk and sgdisk, its ESP a
// valid FAT for fsck.vfat holding the slot's UKI at the firmware's boot
// path, slot a the system image and slot b nothing.
func checkDisk(t *testing.T, out string, m *Manifest) {
	t.Helper()
	disk := filepath.Join(out, DiskFile)
	for _, c := range [][]string{{"sfdisk", "--verify", disk}, {"sgdisk", "-v", disk}} {
		o, err := exec.Command(c[0], c[1:]...).CombinedOutput()
		if err != nil || strings.Contains(strings.ToLower(string(o)), "problem") && !strings.Contains(string(o), "No problems found") {
			t.Errorf("%s: %v\n%s", strings.Join(c, " "), err, o)
		}
	}
	f, err := os.Open(disk)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	st, _ := f.Stat()
	table, err := gpt.Read(f, st.Size())
	if err != nil {
		t.Fatal(err)
	}
	if len(table.Partitions) != 3 || table.NeedsRepair() || m.Disk == nil || len(m.Disk.Partitions) != 3 {
		t.Fatalf("disk.img table %+v, manifest %+v", table, m.Disk)
	}
	wantNames := []string{"EFI system partition", layout.SystemSlotNamePrefix + "a", layout.SystemSlotNamePrefix + "b"}
	for i, p := range table.Partitions {
		mp := m.Disk.Partitions[i]
		if p.Name != wantNames[i] || p.Number != i+1 || mp.GUID != p.ID.String() || mp.FirstLBA != p.FirstLBA {
			t.Errorf("partition %d: %+v, manifest %+v", i+1, p, mp)
		}
	}
	if st.Sys() != nil {
		if used := diskUsage(t, disk); used > st.Size()/2 {
			t.Errorf("disk.img uses %d of %d bytes: not sparse", used, st.Size())
		}
	}

	// The ESP, extracted, passes fsck.vfat and holds the UKIs.
	esp := filepath.Join(t.TempDir(), "esp.img")
	data := make([]byte, table.Partitions[0].Size())
	if _, err := f.ReadAt(data, table.Partitions[0].Offset()); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(esp, data, 0o644); err != nil {
		t.Fatal(err)
	}
	if o, err := exec.Command("fsck.vfat", "-n", esp).CombinedOutput(); err != nil {
		t.Errorf("fsck.vfat -n: %v\n%s", err, o)
	}
	slotA, _ := os.ReadFile(filepath.Join(out, UKISlotFile("a")))
	for _, p := range []string{layout.ESPBootFile, layout.ESPSlotUKI("a")} {
		o, err := exec.Command("mtype", "-i", esp, "::"+p).Output()
		if err != nil || !bytes.Equal(o, slotA) {
			t.Errorf("ESP %s is not slot a's UKI (%d bytes, %v)", p, len(o), err)
		}
	}

	// Slot a starts with the system image; slot b is empty.
	sys, _ := os.ReadFile(filepath.Join(out, SystemFile))
	a := make([]byte, len(sys))
	if _, err := f.ReadAt(a, table.Partitions[1].Offset()); err != nil || !bytes.Equal(a, sys) {
		t.Errorf("slot a does not hold system.img (%v)", err)
	}
	b := make([]byte, 1<<20)
	if _, err := f.ReadAt(b, table.Partitions[2].Offset()); err != nil || !bytes.Equal(b, make([]byte, len(b))) {
		t.Errorf("slot b is not empty (%v)", err)
	}
}

func diskUsage(t *testing.T, p string) int64 {
	o, err := exec.Command("du", "-B1", p).Output()
	if err != nil {
		t.Fatal(err)
	}
	var n int64
	for _, c := range strings.Fields(string(o))[0] {
		n = n*10 + int64(c-'0')
	}
	return n
}
