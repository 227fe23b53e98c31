package image

import (
	"bytes"
	"context"
	"crypto/sha256"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path"
	"path/filepath"
	"slices"
	"sort"
	"strings"
	"time"

	"plinth.dev/plinth/platform/gpt"
	"plinth.dev/plinth/platform/layout"
)

// The flashable disk image (disk.img):
//
//	LBA 0..2047   protective MBR, GPT (platform/gpt's layout)
//	1 ESP         FAT32, DiskESPMiB: EFI/BOOT/BOOTX64.EFI (slot a's UKI),
//	              EFI/plinth/a.efi; plinth/parameters.pb is added per node
//	              by `plinthctl write-disk` (or the test harness)
//	2 slot a      DiskSlotMiB: system.img (squashfs + verity hash tree)
//	3 slot b      DiskSlotMiB: empty until the first update
//	              (no room for data: the node adds entry 4, the data
//	              partition, in the free space of the disk it was flashed
//	              to, and moves the backup GPT to the disk's end)
//	backup GPT    last MiB
//
// Slot b stays empty, so the file is sparse and a flash writes only what
// is used. Every GUID is derived from the system image's root hash and a
// label, and the ESP is made with fixed time stamps, serial and order:
// the same build inputs give the same bytes.

// Disk sizes, in MiB.
const (
	// DiskESPMiB holds three UKIs (the boot file and both slots' during an
	// update) with room to grow.
	DiskESPMiB = 128
	// DiskSlotMiB holds a system image: today's ~75 MiB more than thrice.
	DiskSlotMiB = 256
)

// DiskLayout describes disk.img in the manifest.
type DiskLayout struct {
	Size       int64           `json:"size"`
	DiskGUID   string          `json:"disk_guid"`
	Partitions []DiskPartition `json:"partitions"`
}

// DiskPartition is one GPT entry of disk.img.
type DiskPartition struct {
	Number   int    `json:"number"`
	Name     string `json:"name"`
	Type     string `json:"type"`
	GUID     string `json:"guid"`
	FirstLBA uint64 `json:"first_lba"`
	LastLBA  uint64 `json:"last_lba"`
}

// espFile is one file on the ESP: a path with forward slashes, and the
// artefact it is copied from.
type espFile struct {
	Path   string
	Source string
}

// derivedGUID is a version-4-shaped GUID taken from seed and label, so a
// rebuild gives the same GUIDs and two builds of different system images
// do not share them.
func derivedGUID(seed []byte, label string) gpt.GUID {
	h := sha256.Sum256(append(append([]byte("plinth.disk-guid:"), seed...), ":"+label...))
	var g gpt.GUID
	copy(g[:], h[:16])
	g[7] = g[7]&0x0f | 0x40
	g[8] = g[8]&0x3f | 0x80
	return g
}

// diskTable lays out disk.img's partitions; seed makes its GUIDs.
func diskTable(seed []byte) (*gpt.Table, int64) {
	const mib = 1 << 20 / gpt.SectorSize
	esp := gpt.MustParseGUID(layout.ESPType)
	slot := gpt.MustParseGUID(layout.SystemSlotType)
	first := uint64(gpt.FirstUsableLBA)
	parts := []gpt.Partition{
		{Type: esp, Name: "EFI system partition", FirstLBA: first, LastLBA: first + DiskESPMiB*mib - 1, Number: 1},
	}
	for i, s := range []string{"a", "b"} {
		start := parts[len(parts)-1].LastLBA + 1
		parts = append(parts, gpt.Partition{Type: slot, Name: layout.SystemSlotNamePrefix + s,
			FirstLBA: start, LastLBA: start + DiskSlotMiB*mib - 1, Number: 2 + i})
	}
	for i := range parts {
		parts[i].ID = derivedGUID(seed, parts[i].Name)
	}
	// One MiB after the last partition holds the backup table.
	size := int64(parts[len(parts)-1].LastLBA+1+mib) * gpt.SectorSize
	return gpt.NewTable(derivedGUID(seed, "disk"), parts...), size
}

// writeDisk writes disk.img to out: the ESP with files, slot a with the
// system image at system. seed (the root hash) makes the GUIDs.
func writeDisk(ctx context.Context, tmp, out, system string, files []espFile, seed []byte) (*DiskLayout, error) {
	t, size := diskTable(seed)
	espPart, slotA := t.Partitions[0], t.Partitions[1]
	esp := filepath.Join(tmp, "esp.img")
	if err := makeESP(ctx, esp, espPart.Size(), files); err != nil {
		return nil, err
	}
	f, err := os.Create(out + ".tmp")
	if err != nil {
		return nil, err
	}
	defer os.Remove(out + ".tmp")
	defer f.Close()
	if err := f.Truncate(size); err != nil {
		return nil, err
	}
	for _, c := range []struct {
		src  string
		part gpt.Partition
	}{{esp, espPart}, {system, slotA}} {
		if err := copySparse(f, c.src, c.part); err != nil {
			return nil, err
		}
	}
	if err := gpt.Write(f, size, t); err != nil {
		return nil, err
	}
	if err := f.Close(); err != nil {
		return nil, err
	}
	if err := os.Rename(out+".tmp", out); err != nil {
		return nil, err
	}
	d := &DiskLayout{Size: size, DiskGUID: t.DiskID.String()}
	for _, p := range t.Partitions {
		d.Partitions = append(d.Partitions, DiskPartition{Number: p.Number, Name: p.Name, Type: p.Type.String(),
			GUID: p.ID.String(), FirstLBA: p.FirstLBA, LastLBA: p.LastLBA})
	}
	return d, nil
}

// copySparse copies src into the partition p of w, leaving runs of zeros
// unwritten (the file stays sparse). src must fit.
func copySparse(w io.WriterAt, src string, p gpt.Partition) error {
	in, err := os.Open(src)
	if err != nil {
		return err
	}
	defer in.Close()
	st, err := in.Stat()
	if err != nil {
		return err
	}
	if st.Size() > p.Size() {
		return fmt.Errorf("%s (%s) does not fit partition %q (%s)", filepath.Base(src), mib(st.Size()), p.Name, mib(p.Size()))
	}
	buf := make([]byte, 1<<20)
	zero := make([]byte, 64<<10)
	for off := int64(0); off < st.Size(); off += int64(len(buf)) {
		n, err := in.ReadAt(buf, off)
		if err != nil && err != io.EOF {
			return err
		}
		for b := 0; b < n; b += len(zero) {
			chunk := buf[b:min(b+len(zero), n)]
			if bytes.Equal(chunk, zero[:len(chunk)]) {
				continue
			}
			if _, err := w.WriteAt(chunk, p.Offset()+off+int64(b)); err != nil {
				return err
			}
		}
	}
	return nil
}

// espEpoch is the time stamp of everything on the ESP: FAT's epoch,
// 1980-01-01 00:00 UTC.
const espEpoch = 315532800

// makeESP formats a FAT32 file system of size bytes at file with
// Debian's dosfstools and copies files into it with mtools, with fixed
// time stamps and serial (mkfs.vfat --invariant), so its bytes depend
// only on the files.
func makeESP(ctx context.Context, file string, size int64, files []espFile) error {
	if err := os.WriteFile(file, nil, 0o644); err != nil {
		return err
	}
	if err := os.Truncate(file, size); err != nil {
		return err
	}
	run := func(name string, args ...string) error {
		cmd := exec.CommandContext(ctx, name, args...)
		cmd.Env = append(os.Environ(), fmt.Sprintf("SOURCE_DATE_EPOCH=%d", espEpoch), "MTOOLS_SKIP_CHECK=1")
		if out, err := cmd.CombinedOutput(); err != nil {
			return fmt.Errorf("%s %s: %v: %s (make deps installs dosfstools and mtools)", name, strings.Join(args, " "), err, bytes.TrimSpace(out))
		}
		return nil
	}
	if err := run("mkfs.vfat", "-F", "32", "-n", "PLINTH-ESP", "--invariant", file); err != nil {
		return err
	}
	dirs := map[string]bool{}
	for _, f := range files {
		for d := path.Dir(f.Path); d != "."; d = path.Dir(d) {
			dirs[d] = true
		}
	}
	var ds []string
	for d := range dirs {
		ds = append(ds, d)
	}
	sort.Strings(ds) // parents first
	for _, d := range ds {
		if err := run("mmd", "-i", file, "::"+d); err != nil {
			return err
		}
	}
	files = slices.Clone(files)
	slices.SortFunc(files, func(a, b espFile) int { return strings.Compare(a.Path, b.Path) })
	for _, f := range files {
		// mcopy -m keeps the source's time stamp: a copy with a fixed one.
		tmp := file + ".src"
		if err := copyFile(f.Source, tmp, 0o644); err != nil {
			return err
		}
		if err := os.Chtimes(tmp, time.Unix(espEpoch, 0), time.Unix(espEpoch, 0)); err != nil {
			return err
		}
		err := run("mcopy", "-m", "-i", file, tmp, "::"+f.Path)
		os.Remove(tmp)
		if err != nil {
			return err
		}
	}
	return nil
}
