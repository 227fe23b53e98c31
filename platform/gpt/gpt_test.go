package gpt

import (
	"bytes"
	"errors"
	"fmt"
	"hash/crc32"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"reflect"
	"slices"
	"strconv"
	"strings"
	"testing"
)

var (
	linuxFS   = MustParseGUID("0FC63DAF-8483-4772-8E79-3D69D8477DE4")
	espType   = MustParseGUID("C12A7328-F81F-11D2-BA4B-00A0C93EC93B")
	testDisk  = MustParseGUID("33CFF21B-727D-403E-BCD2-349A674E08C0")
	testPart1 = MustParseGUID("11111111-2222-4333-8444-555555555555")
	testPart2 = MustParseGUID("A0B1C2D3-E4F5-4607-8819-2A3B4C5D6E7F")
)

const testSize = 64 << 20

// mem is an in-memory disk.
type mem []byte

func (m mem) ReadAt(b []byte, off int64) (int, error) {
	if off < 0 || off > int64(len(m)) {
		return 0, io.EOF
	}
	n := copy(b, m[off:])
	if n < len(b) {
		return n, io.EOF
	}
	return n, nil
}

func (m mem) WriteAt(b []byte, off int64) (int, error) {
	if off < 0 || off+int64(len(b)) > int64(len(m)) {
		return 0, errors.New("write past the end of the disk")
	}
	return copy(m[off:], b), nil
}

// cutWriter lets the first `allow` WriteAt calls through and fails the
// rest, as a power cut between two writes would.
type cutWriter struct {
	m     mem
	allow int
}

func (c *cutWriter) WriteAt(b []byte, off int64) (int, error) {
	if c.allow == 0 {
		return 0, errors.New("power cut")
	}
	c.allow--
	return c.m.WriteAt(b, off)
}

func twoPartitions() *Table {
	return NewTable(testDisk,
		Partition{Type: espType, ID: testPart1, FirstLBA: 2048, LastLBA: 2048 + 4096 - 1, Name: "ESP"},
		Partition{Type: linuxFS, ID: testPart2, FirstLBA: 8192, LastLBA: 100000, Name: "data", Attributes: 1 << 60},
	)
}

func mustWrite(t *testing.T, m mem, tab *Table) {
	t.Helper()
	if err := Write(m, int64(len(m)), tab); err != nil {
		t.Fatal(err)
	}
}

func TestGUID(t *testing.T) {
	// The EFI system partition type as UEFI stores it on disk.
	want := []byte{0x28, 0x73, 0x2A, 0xC1, 0x1F, 0xF8, 0xD2, 0x11, 0xBA, 0x4B, 0x00, 0xA0, 0xC9, 0x3E, 0xC9, 0x3B}
	if !bytes.Equal(espType[:], want) {
		t.Fatalf("on-disk bytes % X, want % X", espType[:], want)
	}
	if s := espType.String(); s != "C12A7328-F81F-11D2-BA4B-00A0C93EC93B" {
		t.Fatalf("String() = %s", s)
	}
	if g, err := ParseGUID("c12a7328-f81f-11d2-ba4b-00a0c93ec93b"); err != nil || g != espType {
		t.Fatalf("lowercase parse: %v %v", g, err)
	}
	for _, bad := range []string{"", "C12A7328F81F11D2BA4B00A0C93EC93B", "C12A7328-F81F-11D2-BA4B-00A0C93EC93", "G12A7328-F81F-11D2-BA4B-00A0C93EC93B", "C12A7328-F81F-11D2-BA4B+00A0C93EC93B"} {
		if _, err := ParseGUID(bad); err == nil {
			t.Errorf("ParseGUID(%q) accepted", bad)
		}
	}
	r := RandomGUID()
	s := r.String()
	if s[14] != '4' || !strings.ContainsRune("89AB", rune(s[19])) {
		t.Errorf("random GUID %s is not version 4, variant 10", s)
	}
	if back, _ := ParseGUID(s); back != r {
		t.Errorf("round trip of %s gave %s", s, back)
	}
}

func TestRoundTrip(t *testing.T) {
	m := make(mem, testSize)
	tab := twoPartitions()
	mustWrite(t, m, tab)
	got, err := Read(m, testSize)
	if err != nil {
		t.Fatal(err)
	}
	if got.NeedsRepair() {
		t.Errorf("fresh table needs repair: %+v", got)
	}
	if got.DiskID != testDisk || got.FirstUsableLBA != 2048 || got.LastUsableLBA != testSize/512-34 {
		t.Errorf("header: %v %d..%d", got.DiskID, got.FirstUsableLBA, got.LastUsableLBA)
	}
	want := tab.Partitions
	want[0].Number, want[1].Number = 1, 2
	if !reflect.DeepEqual(got.Partitions, want) {
		t.Errorf("partitions:\n got %+v\nwant %+v", got.Partitions, want)
	}
	p, ok := got.Find(linuxFS)
	if !ok || p.ID != testPart2 || p.Offset() != 8192*512 || p.Size() != (100000-8192+1)*512 {
		t.Errorf("Find: %+v %v", p, ok)
	}
	if _, ok := got.Find(MustParseGUID("00000000-0000-0000-0000-000000000001")); ok {
		t.Error("Find of an absent type succeeded")
	}
	if n := len(got.FindAll(espType)); n != 1 {
		t.Errorf("FindAll: %d", n)
	}
}

func TestNumbersAndNames(t *testing.T) {
	m := make(mem, testSize)
	tab := NewTable(testDisk,
		Partition{Type: linuxFS, ID: testPart1, FirstLBA: 2048, LastLBA: 4095, Name: "ünïcode ☃", Number: 5},
		Partition{Type: linuxFS, ID: testPart2, FirstLBA: 4096, LastLBA: 6143, Name: strings.Repeat("x", 36), Number: 2},
	)
	mustWrite(t, m, tab)
	got, err := Read(m, testSize)
	if err != nil {
		t.Fatal(err)
	}
	// Read returns entries in slot order.
	if len(got.Partitions) != 2 || got.Partitions[0].Number != 2 || got.Partitions[1].Number != 5 ||
		got.Partitions[1].Name != "ünïcode ☃" || got.Partitions[0].Name != strings.Repeat("x", 36) {
		t.Errorf("got %+v", got.Partitions)
	}
}

// TestGapsKeepEntryNumbers: Partitions skips unused entries, but each
// partition keeps its entry index (the kernel's partition number), from
// the primary and from the backup array alike.
func TestGapsKeepEntryNumbers(t *testing.T) {
	m := make(mem, testSize)
	third := MustParseGUID("C3C3C3C3-0000-4000-8000-00000000000C")
	mustWrite(t, m, NewTable(testDisk,
		Partition{Type: espType, ID: testPart1, FirstLBA: 2048, LastLBA: 4095, Number: 1},
		Partition{Type: linuxFS, ID: testPart2, FirstLBA: 4096, LastLBA: 6143, Number: 3},
		Partition{Type: linuxFS, ID: third, FirstLBA: 8192, LastLBA: 10239, Number: 4},
	))
	for _, copyName := range []string{"primary", "backup"} {
		if copyName == "backup" {
			flip(m, 512+16) // primary header CRC
		}
		got, err := Read(m, testSize)
		if err != nil || got.UsedBackup != (copyName == "backup") {
			t.Fatalf("%s: %+v %v", copyName, got, err)
		}
		var numbers []int
		for _, p := range got.Partitions {
			numbers = append(numbers, p.Number)
		}
		if !reflect.DeepEqual(numbers, []int{1, 3, 4}) || got.Partitions[2].ID != third {
			t.Errorf("%s: entry numbers %v, want [1 3 4]", copyName, numbers)
		}
	}
	if tab, _ := SinglePartition(testSize, linuxFS, testPart1, testDisk, ""); tab.Partitions[0].Number != 1 {
		t.Errorf("SinglePartition: number %d, want 1", tab.Partitions[0].Number)
	}
}

func TestSinglePartition(t *testing.T) {
	for _, size := range []int64{testSize, testSize + 512*100, 2<<20 + 34*512} {
		tab, err := SinglePartition(size, linuxFS, testPart1, testDisk, "plinth")
		if err != nil {
			t.Fatalf("%d: %v", size, err)
		}
		p := tab.Partitions[0]
		_, last, _ := UsableRange(size)
		if p.FirstLBA != 2048 || (p.LastLBA+1)%2048 != 0 || p.LastLBA > last || last-p.LastLBA >= 2048 {
			t.Errorf("size %d: partition %d..%d, usable end %d", size, p.FirstLBA, p.LastLBA, last)
		}
		m := make(mem, size)
		mustWrite(t, m, tab)
	}
	if _, err := SinglePartition(1<<20, linuxFS, testPart1, testDisk, ""); err == nil {
		t.Error("1 MiB disk accepted")
	}
	if _, err := SinglePartition(2<<20, linuxFS, testPart1, testDisk, ""); err == nil {
		t.Error("2 MiB disk accepted: no whole MiB fits before the backup table")
	}
}

func TestWriteRejects(t *testing.T) {
	p := func(first, last uint64) Partition {
		return Partition{Type: linuxFS, ID: RandomGUID(), FirstLBA: first, LastLBA: last}
	}
	_, last, _ := UsableRange(testSize)
	cases := map[string]*Table{
		"misaligned":    NewTable(testDisk, p(2049, 5000)),
		"before usable": NewTable(testDisk, p(0, 5000)),
		"past usable":   NewTable(testDisk, p(2048, last+1)),
		"inverted":      NewTable(testDisk, p(4096, 4095)),
		"overlap":       NewTable(testDisk, p(2048, 4096), p(4096, 8000)),
		"zero type":     NewTable(testDisk, Partition{ID: testPart1, FirstLBA: 2048, LastLBA: 4095}),
		"zero id":       NewTable(testDisk, Partition{Type: linuxFS, FirstLBA: 2048, LastLBA: 4095}),
		"duplicate id": NewTable(testDisk, Partition{Type: linuxFS, ID: testPart1, FirstLBA: 2048, LastLBA: 4095},
			Partition{Type: linuxFS, ID: testPart1, FirstLBA: 4096, LastLBA: 6000}),
		"duplicate number": NewTable(testDisk, Partition{Type: linuxFS, ID: testPart1, FirstLBA: 2048, LastLBA: 4095, Number: 2},
			Partition{Type: linuxFS, ID: testPart2, FirstLBA: 4096, LastLBA: 6000}),
		"number too big": NewTable(testDisk, Partition{Type: linuxFS, ID: testPart1, FirstLBA: 2048, LastLBA: 4095, Number: 129}),
		"long name":      NewTable(testDisk, Partition{Type: linuxFS, ID: testPart1, FirstLBA: 2048, LastLBA: 4095, Name: strings.Repeat("x", 37)}),
		"zero disk id":   NewTable(GUID{}, p(2048, 4095)),
	}
	many := NewTable(testDisk)
	for i := 0; i <= EntryCount; i++ {
		many.Partitions = append(many.Partitions, p(uint64(2048*(i+1)), uint64(2048*(i+2)-1)))
	}
	cases["129 partitions"] = many
	for name, tab := range cases {
		m := make(mem, testSize)
		if err := Write(m, testSize, tab); err == nil {
			t.Errorf("%s: accepted", name)
		}
		if !bytes.Equal(m, make(mem, testSize)) {
			t.Errorf("%s: rejected table was partly written", name)
		}
	}
	if err := Write(make(mem, testSize), testSize-1, twoPartitions()); err == nil {
		t.Error("size that is not a multiple of 512 accepted")
	}
}

func TestBlankAndTiny(t *testing.T) {
	if _, err := Read(make(mem, testSize), testSize); !errors.Is(err, ErrNoTable) {
		t.Fatalf("blank disk: %v", err)
	}
	if _, err := Read(make(mem, 4096), 4096); !errors.Is(err, ErrNoTable) {
		t.Fatalf("tiny disk: %v", err)
	}
	// A short reader is an I/O error, never "no table".
	if _, err := Read(make(mem, 1<<20), testSize); err == nil || errors.Is(err, ErrNoTable) || errors.Is(err, ErrCorrupt) {
		t.Fatalf("short device: %v", err)
	}
}

// flip inverts one bit of the byte at off.
func flip(m mem, off int64) { m[off] ^= 0x10 }

func TestCorruptPrimaryUsesBackup(t *testing.T) {
	n := int64(testSize / 512)
	for name, off := range map[string]int64{
		"signature":   512,
		"header CRC":  512 + 16,
		"disk GUID":   512 + 60,
		"my LBA":      512 + 24,
		"entries CRC": 512 + 88,
		"entry array": 2*512 + 130, // partition 2's type
		"entry name":  2*512 + 60,
	} {
		m := make(mem, testSize)
		mustWrite(t, m, twoPartitions())
		flip(m, off)
		got, err := Read(m, testSize)
		if err != nil {
			t.Errorf("%s: %v", name, err)
			continue
		}
		if !got.UsedBackup || got.BackupDamaged || !got.NeedsRepair() || len(got.Partitions) != 2 || got.DiskID != testDisk {
			t.Errorf("%s: %+v", name, got)
		}
		// Writing the table read from the backup repairs the primary.
		mustWrite(t, m, got)
		if again, err := Read(m, testSize); err != nil || again.NeedsRepair() {
			t.Errorf("%s: after repair: %+v %v", name, again, err)
		}
	}

	for name, off := range map[string]int64{
		"backup header": (n - 1) * 512,
		"backup CRC":    (n-1)*512 + 16,
		"backup array":  (n-33)*512 + 40,
	} {
		m := make(mem, testSize)
		mustWrite(t, m, twoPartitions())
		flip(m, off)
		got, err := Read(m, testSize)
		if err != nil || got.UsedBackup || !got.BackupDamaged {
			t.Errorf("%s: %+v %v", name, got, err)
		}
	}
}

func TestCorruptBoth(t *testing.T) {
	n := int64(testSize / 512)
	for name, offs := range map[string][]int64{
		"both headers":   {512 + 20 + 8, (n-1)*512 + 20 + 8},
		"both arrays":    {2*512 + 1, (n-33)*512 + 1},
		"header + array": {512 + 40, (n-33)*512 + 1},
	} {
		m := make(mem, testSize)
		mustWrite(t, m, twoPartitions())
		for _, off := range offs {
			flip(m, off)
		}
		if _, err := Read(m, testSize); !errors.Is(err, ErrCorrupt) {
			t.Errorf("%s: %v, want ErrCorrupt", name, err)
		}
	}
	// Headers gone but the protective MBR still there: a trace of a GPT,
	// so corrupt rather than absent.
	m := make(mem, testSize)
	mustWrite(t, m, twoPartitions())
	clear(m[512:1024])
	clear(m[(n-1)*512:])
	if _, err := Read(m, testSize); !errors.Is(err, ErrCorrupt) {
		t.Errorf("MBR only: %v, want ErrCorrupt", err)
	}
}

func TestSemanticChecks(t *testing.T) {
	// Entries whose CRCs are right but whose contents are impossible make
	// that copy invalid. Build one by writing with a relaxed layout, then
	// fixing the CRCs by hand.
	n := uint64(testSize / 512)
	m := make(mem, testSize)
	mustWrite(t, m, twoPartitions())
	entries := make([]byte, EntryCount*EntrySize)
	copy(entries, m[2*512:34*512])
	// Partition 2 now overlaps partition 1.
	copy(entries[128+32:], []byte{0x00, 0x10}) // FirstLBA = 0x1000 = 4096
	rewrite := func(hdrLBA, entriesLBA uint64) {
		copy(m[entriesLBA*512:], entries)
		hdr := m[hdrLBA*512 : hdrLBA*512+512]
		var first, last uint64 = 2048, n - 34
		alt := n - 1
		if hdrLBA != 1 {
			alt = 1
		}
		clear(hdr)
		putHeader(hdr, testDisk, hdrLBA, alt, first, last, entriesLBA, crc32.ChecksumIEEE(entries))
	}
	rewrite(1, 2)
	got, err := Read(m, testSize)
	if err != nil || !got.UsedBackup {
		t.Fatalf("overlapping primary: %+v %v", got, err)
	}
	rewrite(n-1, n-33)
	if _, err := Read(m, testSize); !errors.Is(err, ErrCorrupt) || !strings.Contains(err.Error(), "overlap") {
		t.Fatalf("overlap in both copies: %v", err)
	}
}

func TestProtectiveMBR(t *testing.T) {
	m := make(mem, testSize)
	mustWrite(t, m, twoPartitions())
	// Zeroed MBR: accepted, reported.
	saved := append([]byte(nil), m[:512]...)
	clear(m[:512])
	got, err := Read(m, testSize)
	if err != nil || !got.ProtectiveMBRMissing || !got.NeedsRepair() {
		t.Errorf("zero MBR: %+v %v", got, err)
	}
	// A DOS MBR (type 0x83 entry): the GPT behind it is stale.
	copy(m, saved)
	m[446+4] = 0x83
	if _, err := Read(m, testSize); !errors.Is(err, ErrNoProtectiveMBR) {
		t.Errorf("DOS MBR: %v", err)
	}
	// A DOS MBR alone is no GPT.
	clear(m)
	m[446+4], m[510], m[511] = 0x83, 0x55, 0xAA
	if _, err := Read(m, testSize); !errors.Is(err, ErrNoTable) {
		t.Errorf("DOS MBR without GPT: %v", err)
	}
}

func TestInterruptedWrite(t *testing.T) {
	for allow := 0; allow <= 3; allow++ {
		c := &cutWriter{m: make(mem, testSize), allow: allow}
		err := Write(c, testSize, twoPartitions())
		if (err == nil) != (allow == 3) {
			t.Fatalf("allow %d: Write returned %v", allow, err)
		}
		got, err := Read(c.m, testSize)
		switch allow {
		case 0:
			if !errors.Is(err, ErrNoTable) {
				t.Errorf("cut before any write: %v", err)
			}
		case 1: // backup only
			if err != nil || !got.UsedBackup || !got.ProtectiveMBRMissing || len(got.Partitions) != 2 {
				t.Errorf("cut after backup: %+v %v", got, err)
			}
		case 2: // backup and primary, no MBR
			if err != nil || got.UsedBackup || got.BackupDamaged || !got.ProtectiveMBRMissing {
				t.Errorf("cut before MBR: %+v %v", got, err)
			}
		case 3:
			if err != nil || got.NeedsRepair() {
				t.Errorf("complete: %+v %v", got, err)
			}
		}
	}
}

// sfdiskDump is what `sfdisk --dump` says about an image.
type sfdiskDump struct {
	label, labelID    string
	firstLBA, lastLBA uint64
	parts             []sfdiskPart
}

type sfdiskPart struct {
	start, size uint64
	typ, uuid   string
	name        string
}

func needSfdisk(t *testing.T) {
	t.Helper()
	if _, err := exec.LookPath("sfdisk"); err != nil {
		t.Fatal("sfdisk missing: install util-linux's sfdisk (Debian package fdisk, see scripts/install-deps)")
	}
}

func dumpSfdisk(t *testing.T, img string) sfdiskDump {
	t.Helper()
	out, err := exec.Command("sfdisk", "--dump", img).CombinedOutput()
	if err != nil {
		t.Fatalf("sfdisk --dump: %v\n%s", err, out)
	}
	var d sfdiskDump
	for _, line := range strings.Split(string(out), "\n") {
		if k, v, ok := strings.Cut(line, ": "); ok && !strings.Contains(line, "start=") {
			switch k {
			case "label":
				d.label = v
			case "label-id":
				d.labelID = v
			case "first-lba":
				d.firstLBA, _ = strconv.ParseUint(v, 10, 64)
			case "last-lba":
				d.lastLBA, _ = strconv.ParseUint(v, 10, 64)
			}
			continue
		}
		_, fields, ok := strings.Cut(line, " : ")
		if !ok {
			continue
		}
		var p sfdiskPart
		for _, f := range strings.Split(fields, ", ") {
			k, v, _ := strings.Cut(strings.TrimSpace(f), "=")
			switch k {
			case "start":
				p.start, _ = strconv.ParseUint(strings.TrimSpace(v), 10, 64)
			case "size":
				p.size, _ = strconv.ParseUint(strings.TrimSpace(v), 10, 64)
			case "type":
				p.typ = v
			case "uuid":
				p.uuid = v
			case "name":
				p.name = strings.Trim(v, `"`)
			}
		}
		d.parts = append(d.parts, p)
	}
	return d
}

// TestWriteMatchesSfdisk checks our tables against util-linux's
// independent GPT implementation.
func TestWriteMatchesSfdisk(t *testing.T) {
	needSfdisk(t)
	single, err := SinglePartition(testSize, linuxFS, testPart1, testDisk, "plinth-data")
	if err != nil {
		t.Fatal(err)
	}
	for name, tab := range map[string]*Table{"single": single, "two": twoPartitions()} {
		img := filepath.Join(t.TempDir(), "disk.img")
		f, err := os.Create(img)
		if err != nil {
			t.Fatal(err)
		}
		if err := f.Truncate(testSize); err != nil {
			t.Fatal(err)
		}
		err = Write(f, testSize, tab)
		f.Close()
		if err != nil {
			t.Fatal(err)
		}
		if out, err := exec.Command("sfdisk", "--verify", img).CombinedOutput(); err != nil || !strings.Contains(string(out), "No errors detected") {
			t.Errorf("%s: sfdisk --verify: %v\n%s", name, err, out)
		}
		d := dumpSfdisk(t, img)
		if d.label != "gpt" || d.labelID != testDisk.String() || d.firstLBA != 2048 || d.lastLBA != testSize/512-34 {
			t.Errorf("%s: sfdisk header %+v", name, d)
		}
		if len(d.parts) != len(tab.Partitions) {
			t.Fatalf("%s: sfdisk sees %d partitions: %+v", name, len(d.parts), d.parts)
		}
		for i, p := range tab.Partitions {
			want := sfdiskPart{start: p.FirstLBA, size: p.LastLBA - p.FirstLBA + 1, typ: p.Type.String(), uuid: p.ID.String(), name: p.Name}
			if d.parts[i] != want {
				t.Errorf("%s: partition %d: sfdisk %+v, want %+v", name, i+1, d.parts[i], want)
			}
		}
	}
}

// TestReadsSfdiskTable reads a table that sfdisk wrote.
func TestReadsSfdiskTable(t *testing.T) {
	needSfdisk(t)
	img := filepath.Join(t.TempDir(), "disk.img")
	if err := os.WriteFile(img, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.Truncate(img, testSize); err != nil {
		t.Fatal(err)
	}
	script := fmt.Sprintf("label: gpt\nlabel-id: %s\nfirst-lba: 2048\n"+
		"start=2048, size=4096, type=%s, uuid=%s, name=\"héllo\"\n"+
		"start=8192, type=%s, uuid=%s\n", testDisk, espType, testPart1, linuxFS, testPart2)
	cmd := exec.Command("sfdisk", "--quiet", img)
	cmd.Stdin = strings.NewReader(script)
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("sfdisk: %v\n%s", err, out)
	}
	f, err := os.Open(img)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	got, err := Read(f, testSize)
	if err != nil {
		t.Fatal(err)
	}
	d := dumpSfdisk(t, img)
	if got.DiskID != testDisk || got.NeedsRepair() || got.FirstUsableLBA != d.firstLBA || got.LastUsableLBA != d.lastLBA || len(got.Partitions) != 2 {
		t.Fatalf("got %+v, sfdisk %+v", got, d)
	}
	p1, p2 := got.Partitions[0], got.Partitions[1]
	if p1.Type != espType || p1.ID != testPart1 || p1.FirstLBA != 2048 || p1.LastLBA != 6143 || p1.Name != "héllo" || p1.Number != 1 {
		t.Errorf("partition 1: %+v", p1)
	}
	if p2.Type != linuxFS || p2.ID != testPart2 || p2.FirstLBA != 8192 || p2.LastLBA != d.parts[1].start+d.parts[1].size-1 || p2.Number != 2 {
		t.Errorf("partition 2: %+v (sfdisk %+v)", p2, d.parts[1])
	}
}

// FuzzRead overwrites the start of the primary and backup regions of a
// valid image with fuzz data: Read must never panic, must fail only with
// its documented errors, and must never accept an impossible partition.
func FuzzRead(f *testing.F) {
	const size = 4 << 20
	base := make(mem, size)
	if err := Write(base, size, twoPartitionsSmall()); err != nil {
		f.Fatal(err)
	}
	n := int64(size / 512)
	f.Add(append([]byte(nil), base[:34*512]...), append([]byte(nil), base[(n-33)*512:]...))
	f.Add([]byte{}, []byte{})
	f.Add([]byte(base[:1024]), []byte("EFI PART"))
	m := append(mem(nil), base...)
	f.Fuzz(func(t *testing.T, primary, backup []byte) {
		// Restore the two regions instead of copying the whole image.
		copy(m[:34*512], base[:34*512])
		copy(m[(n-33)*512:], base[(n-33)*512:])
		copy(m[:34*512], primary)
		copy(m[(n-33)*512:], backup)
		tab, err := Read(m, size)
		if err != nil {
			if !errors.Is(err, ErrNoTable) && !errors.Is(err, ErrCorrupt) && !errors.Is(err, ErrNoProtectiveMBR) {
				t.Fatalf("unexpected error kind: %v", err)
			}
			return
		}
		for _, p := range tab.Partitions {
			if p.FirstLBA > p.LastLBA || p.FirstLBA < tab.FirstUsableLBA || p.LastLBA > tab.LastUsableLBA {
				t.Fatalf("accepted impossible partition %+v", p)
			}
		}
	})
}

func twoPartitionsSmall() *Table {
	return NewTable(testDisk,
		Partition{Type: espType, ID: testPart1, FirstLBA: 2048, LastLBA: 4095, Name: "a"},
		Partition{Type: linuxFS, ID: testPart2, FirstLBA: 4096, LastLBA: 6143, Name: "b"},
	)
}

// TestAddPartition: a partition added to a flashed disk's table (entries
// 1..3, a gap between 2 and 3, the disk grown past the image) takes the
// largest free aligned range and the first unused entry; the others are
// untouched and the written table reads back with the backup at the end.
func TestAddPartition(t *testing.T) {
	const mib = Alignment
	typ, other := RandomGUID(), RandomGUID()
	tab := NewTable(RandomGUID(),
		Partition{Type: typ, ID: RandomGUID(), FirstLBA: 1 * mib, LastLBA: 3*mib - 1, Number: 1, Name: "esp"},
		Partition{Type: typ, ID: RandomGUID(), FirstLBA: 3 * mib, LastLBA: 5*mib - 1, Number: 2, Name: "a"},
		Partition{Type: typ, ID: RandomGUID(), FirstLBA: 6 * mib, LastLBA: 8*mib - 1, Number: 4, Name: "b"},
	)
	image := int64(9 << 20)
	img := make(mem, image)
	if err := Write(img, image, tab); err != nil {
		t.Fatal(err)
	}
	// Flashed onto a 40 MiB disk.
	size := int64(40 << 20)
	disk := append(img, make(mem, size-image)...)
	read, err := Read(disk, size)
	if err != nil {
		t.Fatal(err)
	}
	before := append([]Partition(nil), read.Partitions...)
	p, err := read.AddPartition(size, other, RandomGUID(), "data")
	if err != nil {
		t.Fatal(err)
	}
	_, last, _ := UsableRange(size)
	if p.Number != 3 || p.FirstLBA != 8*mib || p.LastLBA != (last+1)/Alignment*Alignment-1 {
		t.Fatalf("added %+v (usable last %d)", p, last)
	}
	if err := Write(disk, size, read); err != nil {
		t.Fatal(err)
	}
	again, err := Read(disk, size)
	if err != nil || again.NeedsRepair() || len(again.Partitions) != 4 {
		t.Fatalf("read back: %+v, %v", again, err)
	}
	for i, b := range before {
		a := again.Partitions[slices.IndexFunc(again.Partitions, func(x Partition) bool { return x.Number == b.Number })]
		if a != b {
			t.Errorf("entry %d changed: %+v → %+v", i, b, a)
		}
	}
	// A full disk has no room.
	full, _ := SinglePartition(size, typ, RandomGUID(), RandomGUID(), "all")
	if _, err := full.AddPartition(size, other, RandomGUID(), "data"); err == nil {
		t.Error("added a partition to a full disk")
	}
}
