package storage

import (
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"testing"

	"plinth.dev/plinth/platform/gpt"
)

var (
	linuxFSType = gpt.MustParseGUID("0FC63DAF-8483-4772-8E79-3D69D8477DE4")
	gapDiskID   = gpt.MustParseGUID("5D1F0C7A-2B4E-4C11-9A0B-7E6F5D4C3B2A")
	partA       = gpt.MustParseGUID("A1A1A1A1-0000-4000-8000-00000000000A")
	partB       = gpt.MustParseGUID("B2B2B2B2-0000-4000-8000-00000000000B")
	partPlinth  = gpt.MustParseGUID("C3C3C3C3-0000-4000-8000-00000000000C")
)

const gapDiskSize = 64 << 20

// gapImage writes a disk image whose GPT has entries A (1), nothing (2),
// B (3) and the Plinth data partition (4), as a flashed disk with an
// unused slot might, and returns the open image.
func gapImage(t *testing.T) *os.File {
	t.Helper()
	f, err := os.Create(filepath.Join(t.TempDir(), "disk.img"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { f.Close() })
	if err := f.Truncate(gapDiskSize); err != nil {
		t.Fatal(err)
	}
	tab := gpt.NewTable(gapDiskID,
		gpt.Partition{Type: linuxFSType, ID: partA, FirstLBA: 2048, LastLBA: 4095, Name: "A", Number: 1},
		gpt.Partition{Type: linuxFSType, ID: partB, FirstLBA: 4096, LastLBA: 6143, Name: "B", Number: 3},
		gpt.Partition{Type: DataPartitionType, ID: partPlinth, FirstLBA: 8192, LastLBA: 2048*30 - 1, Name: "plinth-data", Number: 4},
	)
	if err := gpt.Write(f, gapDiskSize, tab); err != nil {
		t.Fatal(err)
	}
	return f
}

// TestDataPartitionIsFoundByEntryNumber: the data partition is entry 4,
// the kernel's vda4, although it is the third used entry. Taking its
// position among the used entries would open (and, were B's start zero,
// format) B.
func TestDataPartitionIsFoundByEntryNumber(t *testing.T) {
	f := gapImage(t)
	tab, err := gpt.Read(f, gapDiskSize)
	if err != nil {
		t.Fatal(err)
	}
	p, n, ok := findPartition(tab)
	if !ok || n != 4 || p.ID != partPlinth {
		t.Fatalf("data partition: number %d, %v %v; want entry 4 (%v)", n, p.ID, ok, partPlinth)
	}
}

// TestHeaderCheckRefusesAnotherPartition: read through the right entry,
// the header matches; read through a wrong number (B, entry 3), a header
// there belongs to another partition GUID and is refused. A zero start of
// B would pass the header check, which is why the device itself is
// checked too (TestPartitionDeviceCheck).
func TestHeaderCheckRefusesAnotherPartition(t *testing.T) {
	f := gapImage(t)
	tab, err := gpt.Read(f, gapDiskSize)
	if err != nil {
		t.Fatal(err)
	}
	parts := map[int]gpt.Partition{}
	for _, p := range tab.Partitions {
		parts[p.Number] = p
	}
	if len(parts) != 3 || parts[2].Number != 0 {
		t.Fatalf("entries %+v", tab.Partitions)
	}
	section := func(p gpt.Partition) *io.SectionReader { return io.NewSectionReader(f, p.Offset(), p.Size()) }
	write := func(p gpt.Partition, id gpt.GUID) {
		h := testHeader()
		h.PartitionID = id
		if err := WriteHeader(io.NewOffsetWriter(f, p.Offset()), 0, h); err != nil {
			t.Fatal(err)
		}
	}
	log := slog.New(slog.DiscardHandler)
	data, n, _ := findPartition(tab)
	if n != 4 {
		t.Fatalf("data partition number %d", n)
	}

	// B's start is zero: nothing to tell it apart from a fresh data partition.
	if h, err := readPartitionHeader(section(parts[3]), data, "vda3", log); h != nil || err != nil {
		t.Fatalf("zero B: %v %v", h, err)
	}
	write(data, partPlinth)
	write(parts[3], partB)
	if h, err := readPartitionHeader(section(data), data, "vda4", log); err != nil || h.PartitionID != partPlinth {
		t.Fatalf("entry 4: %+v %v", h, err)
	}
	if h, err := readPartitionHeader(section(parts[3]), data, "vda3", log); h != nil || !errors.Is(err, ErrRefused) {
		t.Fatalf("entry 3 read as the data partition: %+v %v", h, err)
	}
}

// fakePartition makes a sysfs partition directory.
func fakePartition(t *testing.T, root, disk, name string, number int, start, size uint64, dev string) string {
	t.Helper()
	dir := filepath.Join(root, disk, name)
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	for file, v := range map[string]string{
		"partition": fmt.Sprint(number), "start": fmt.Sprint(start), "size": fmt.Sprint(size), "dev": dev,
	} {
		if err := os.WriteFile(filepath.Join(dir, file), []byte(v+"\n"), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	return dir
}

// TestPartitionDeviceCheck: the kernel's device must be the GPT entry.
func TestPartitionDeviceCheck(t *testing.T) {
	f := gapImage(t)
	tab, err := gpt.Read(f, gapDiskSize)
	if err != nil {
		t.Fatal(err)
	}
	data, _, _ := findPartition(tab)
	size := data.LastLBA - data.FirstLBA + 1
	root := t.TempDir()
	good := fakePartition(t, root, "vda", "vda4", 4, data.FirstLBA, size, "253:4")
	if err := checkPartitionSysfs(good, "253:4", data); err != nil {
		t.Fatalf("matching device: %v", err)
	}
	for name, c := range map[string]struct {
		dir, dev string
	}{
		"another entry (B)": {fakePartition(t, root, "vda", "vda3", 3, 4096, 2048, "253:3"), "253:3"},
		"stale start":       {fakePartition(t, root, "vdb", "vdb4", 4, data.FirstLBA+2048, size, "253:20"), "253:20"},
		"stale size":        {fakePartition(t, root, "vdc", "vdc4", 4, data.FirstLBA, size-1, "253:36"), "253:36"},
		"other device node": {good, "253:3"},
		"no such partition": {filepath.Join(root, "vda", "vda9"), "253:9"},
	} {
		if err := checkPartitionSysfs(c.dir, c.dev, data); !errors.Is(err, ErrRefused) {
			t.Errorf("%s: %v, want a refusal", name, err)
		}
	}
}

// TestNoImplicitDisk: every call names the disk chosen for this boot.
func TestNoImplicitDisk(t *testing.T) {
	if _, err := Peek(""); !errors.Is(err, errNoDisk) {
		t.Errorf("Peek(\"\"): %v", err)
	}
	if err := UpdateEnrolment("", []byte("x")); !errors.Is(err, errNoDisk) {
		t.Errorf("UpdateEnrolment(\"\"): %v", err)
	}
	if _, err := Open(t.Context(), Config{Mode: ModeCrypt}); !errors.Is(err, errNoDisk) {
		t.Errorf("Open without a disk: %v", err)
	}
}

// TestSeveralDataPartitionsRefused: two Plinth data partitions on one
// disk are ambiguous.
func TestSeveralDataPartitionsRefused(t *testing.T) {
	tab := gpt.NewTable(gapDiskID,
		gpt.Partition{Type: DataPartitionType, ID: partA, FirstLBA: 2048, LastLBA: 4095, Number: 2},
		gpt.Partition{Type: DataPartitionType, ID: partB, FirstLBA: 4096, LastLBA: 6143, Number: 5},
	)
	if _, _, ok := findPartition(tab); ok {
		t.Error("two data partitions: one was chosen")
	}
}
