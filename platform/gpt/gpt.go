// Package gpt reads and writes GUID partition tables (UEFI 2.x, chapter 5)
// on any io.ReaderAt / io.WriterAt with 512-byte logical sectors: a block
// device or an image file.
//
// Plinth writes exactly one layout:
//
//	LBA 0        protective MBR (one 0xEE entry covering the disk)
//	LBA 1        primary header
//	LBA 2..33    primary entry array: 128 entries of 128 bytes
//	LBA 34..2047 unused, so the first partition starts at 1 MiB
//	LBA 2048..   partitions, each starting on a 1 MiB boundary
//	last-32..last-1  backup entry array
//	last         backup header
//
// Reading is strict, because the node decides from it whether a disk may be
// formatted: a table is used only when its header and entry-array CRCs, its
// LBAs and its partitions all check out, and a damaged table is an error
// (ErrCorrupt), never "no table". ErrNoTable only says there is no GPT; it
// does not say the disk is blank — that is a separate check on the bytes.
package gpt

import (
	"bytes"
	"crypto/rand"
	"encoding/binary"
	"encoding/hex"
	"errors"
	"fmt"
	"hash/crc32"
	"io"
	"sort"
	"strings"
	"unicode/utf16"
)

const (
	// SectorSize is the logical sector size this package works with.
	SectorSize = 512
	// Alignment is the partition alignment in sectors (1 MiB), which suits
	// every erase block and RAID stripe in practice and is what sfdisk and
	// sgdisk use.
	Alignment = 2048
	// FirstUsableLBA is the first usable LBA of a table written by Write.
	FirstUsableLBA = Alignment
	// EntryCount and EntrySize describe the entry arrays Write produces:
	// the UEFI minimum of 16 KiB, 32 sectors.
	EntryCount = 128
	EntrySize  = 128

	entrySectors = EntryCount * EntrySize / SectorSize
	headerSize   = 92 // bytes of a revision 1.0 header covered by its CRC
	revision     = 0x00010000
	signature    = "EFI PART"
	maxNameUnits = 36 // UTF-16 code units in an entry's name field
	// maxEntryBytes bounds what Read allocates for an entry array; real
	// tables use 16 KiB, and a corrupt count must not make us read gigabytes.
	maxEntryBytes = 1 << 20
	// minSectors: MBR, two headers and two 32-sector arrays.
	minSectors = 3 + 2*entrySectors
)

var (
	// ErrNoTable: neither header has the GPT signature and LBA 0 is not a
	// protective MBR. The disk may still hold other data.
	ErrNoTable = errors.New("gpt: no partition table")
	// ErrCorrupt: there are signs of a GPT but neither copy is valid.
	ErrCorrupt = errors.New("gpt: corrupt partition table")
	// ErrNoProtectiveMBR: a valid GPT, but LBA 0 holds an MBR without a
	// protective (0xEE) entry. Such a GPT is usually stale, left behind when
	// the disk was repartitioned with MBR tools, so it is not trusted.
	ErrNoProtectiveMBR = errors.New("gpt: LBA 0 holds an MBR without a protective entry")
)

// GUID is a GUID in its on-disk byte order. UEFI stores the first three
// fields little-endian and the last two as bytes ("mixed-endian"); keeping
// the disk order in memory means a GUID is copied to and from disk
// untouched and only String and ParseGUID convert.
type GUID [16]byte

// ParseGUID parses the textual form "XXXXXXXX-XXXX-XXXX-XXXX-XXXXXXXXXXXX"
// (either case).
func ParseGUID(s string) (GUID, error) {
	var g GUID
	if len(s) != 36 || s[8] != '-' || s[13] != '-' || s[18] != '-' || s[23] != '-' {
		return g, fmt.Errorf("gpt: malformed GUID %q", s)
	}
	raw, err := hex.DecodeString(s[0:8] + s[9:13] + s[14:18] + s[19:23] + s[24:36])
	if err != nil {
		return g, fmt.Errorf("gpt: malformed GUID %q", s)
	}
	// raw is the big-endian textual order; swap the first three fields.
	g[0], g[1], g[2], g[3] = raw[3], raw[2], raw[1], raw[0]
	g[4], g[5] = raw[5], raw[4]
	g[6], g[7] = raw[7], raw[6]
	copy(g[8:], raw[8:])
	return g, nil
}

// MustParseGUID is ParseGUID for constants; it panics on a malformed string.
func MustParseGUID(s string) GUID {
	g, err := ParseGUID(s)
	if err != nil {
		panic(err)
	}
	return g
}

// RandomGUID returns a random (version 4, RFC 4122 variant) GUID.
func RandomGUID() GUID {
	var g GUID
	// crypto/rand.Read never returns an error since Go 1.24: it crashes.
	rand.Read(g[:])
	// Version 4 in the high nibble of the third field (byte 7 on disk),
	// variant 10xx in the top bits of byte 8.
	g[7] = g[7]&0x0f | 0x40
	g[8] = g[8]&0x3f | 0x80
	return g
}

// String returns the uppercase textual form, as sfdisk and sgdisk print it.
func (g GUID) String() string {
	return fmt.Sprintf("%08X-%04X-%04X-%X-%X",
		binary.LittleEndian.Uint32(g[0:4]),
		binary.LittleEndian.Uint16(g[4:6]),
		binary.LittleEndian.Uint16(g[6:8]),
		g[8:10], g[10:16])
}

// IsZero reports whether g is the all-zero GUID, which marks an unused entry.
func (g GUID) IsZero() bool { return g == GUID{} }

// Partition is one used entry of a partition table.
type Partition struct {
	Type, ID GUID
	// FirstLBA and LastLBA are inclusive, in 512-byte sectors.
	FirstLBA, LastLBA uint64
	Name              string // at most 36 UTF-16 code units
	Attributes        uint64
	// Number is the 1-based index in the entry array, the kernel's partition
	// number (sda1 is Number 1). Read sets it; for Write, 0 means "the
	// partition's position in Table.Partitions plus one".
	Number int
}

// Offset returns the partition's start in bytes.
func (p Partition) Offset() int64 { return int64(p.FirstLBA) * SectorSize }

// Size returns the partition's length in bytes.
func (p Partition) Size() int64 { return int64(p.LastLBA-p.FirstLBA+1) * SectorSize }

// Table is a GUID partition table.
type Table struct {
	DiskID     GUID
	Partitions []Partition

	// The fields below describe what Read found. Write ignores them: it
	// always writes the layout described in the package documentation.

	// FirstUsableLBA and LastUsableLBA are the header's usable range.
	FirstUsableLBA, LastUsableLBA uint64
	// UsedBackup: the primary header or entries were invalid and the table
	// came from the backup at the last LBA.
	UsedBackup bool
	// BackupDamaged: the primary was used, and the backup is invalid,
	// missing or describes a different table.
	BackupDamaged bool
	// ProtectiveMBRMissing: LBA 0 was all zero. Write puts the MBR last, so
	// this is what a write interrupted just before the end leaves behind.
	ProtectiveMBRMissing bool
}

// NeedsRepair reports whether one of the redundant structures was damaged,
// so writing the table again (Write) would restore full redundancy.
func (t *Table) NeedsRepair() bool {
	return t.UsedBackup || t.BackupDamaged || t.ProtectiveMBRMissing
}

// NewTable returns a table with the given disk GUID and partitions.
func NewTable(diskID GUID, parts ...Partition) *Table {
	return &Table{DiskID: diskID, Partitions: parts}
}

// UsableRange returns the first and last LBA a partition may use on a disk
// of size bytes, in the layout Write produces.
func UsableRange(size int64) (first, last uint64, err error) {
	if size < 0 || size%SectorSize != 0 {
		return 0, 0, fmt.Errorf("gpt: disk size %d is not a multiple of %d", size, SectorSize)
	}
	n := uint64(size / SectorSize)
	if n < FirstUsableLBA+1+entrySectors+1 {
		return 0, 0, fmt.Errorf("gpt: disk of %d bytes is too small for a partition", size)
	}
	return FirstUsableLBA, n - 2 - entrySectors, nil
}

// SinglePartition lays out one partition that fills the disk, as entry 1:
// it starts at 1 MiB and ends on the last whole MiB before the backup
// table, so its size is a whole number of MiB (which keeps every block size
// up to 1 MiB aligned for dm-crypt, dm-integrity and the filesystem).
func SinglePartition(size int64, typ, id, diskID GUID, name string) (*Table, error) {
	first, last, err := UsableRange(size)
	if err != nil {
		return nil, err
	}
	end := (last+1)/Alignment*Alignment - 1
	if end < first {
		return nil, fmt.Errorf("gpt: disk of %d bytes has no whole aligned MiB for a partition", size)
	}
	return NewTable(diskID, Partition{Type: typ, ID: id, FirstLBA: first, LastLBA: end, Name: name, Number: 1}), nil
}

// AddPartition adds a partition to t in the largest free range of a disk
// of size bytes, starting on a 1 MiB boundary and ending on the last
// whole MiB of that range, as the first unused entry. The other entries
// keep their numbers and content. This is how a node adds its data
// partition to a flashed disk, which may be larger than the image it was
// flashed from: Write then puts the backup table at the disk's real end.
func (t *Table) AddPartition(size int64, typ, id GUID, name string) (Partition, error) {
	first, last, err := UsableRange(size)
	if err != nil {
		return Partition{}, err
	}
	used := map[int]bool{}
	ps := append([]Partition(nil), t.Partitions...)
	for i, p := range ps {
		n := p.Number
		if n == 0 {
			n = i + 1
		}
		used[n] = true
	}
	number := 1
	for used[number] {
		number++
	}
	if number > EntryCount {
		return Partition{}, fmt.Errorf("gpt: no unused entry for a new partition")
	}
	if err := checkOverlap(ps); err != nil {
		return Partition{}, err
	}
	var best Partition
	start := first
	for i := 0; i <= len(ps); i++ {
		end := last
		if i < len(ps) {
			end = ps[i].FirstLBA - 1
		}
		a := (start + Alignment - 1) / Alignment * Alignment
		e := (end+1)/Alignment*Alignment - 1
		if end+1 > start && e > a && e-a > best.LastLBA-best.FirstLBA {
			best = Partition{FirstLBA: a, LastLBA: e}
		}
		if i < len(ps) && ps[i].LastLBA+1 > start {
			start = ps[i].LastLBA + 1
		}
	}
	if best.LastLBA == 0 {
		return Partition{}, fmt.Errorf("gpt: no free whole MiB on a disk of %d bytes for a new partition", size)
	}
	p := Partition{Type: typ, ID: id, FirstLBA: best.FirstLBA, LastLBA: best.LastLBA, Name: name, Number: number}
	t.Partitions = append(t.Partitions, p)
	return p, nil
}

// Find returns the first partition of the given type.
func (t *Table) Find(typ GUID) (Partition, bool) {
	for _, p := range t.Partitions {
		if p.Type == typ {
			return p, true
		}
	}
	return Partition{}, false
}

// FindAll returns every partition of the given type, so a caller can refuse
// a disk that has more than one where it expects exactly one.
func (t *Table) FindAll(typ GUID) []Partition {
	var ps []Partition
	for _, p := range t.Partitions {
		if p.Type == typ {
			ps = append(ps, p)
		}
	}
	return ps
}

// syncer is implemented by *os.File; Write flushes between steps with it.
type syncer interface{ Sync() error }

// Write writes t as a protective MBR, a primary header and entry array at
// LBA 1..33, and a backup entry array and header at the end of the disk.
// size must be a multiple of 512. Partitions must start on a 1 MiB
// boundary, lie within the usable range and not overlap; nothing is written
// if t is invalid.
//
// The order makes an interrupted write recoverable: the backup goes first,
// then the primary, then the MBR, each flushed (if w has Sync) before the
// next. Cut after the backup, Read falls back to it; cut after the primary,
// Read accepts the missing MBR and reports it. Only a cut inside the very
// first write can leave nothing valid behind.
func Write(w io.WriterAt, size int64, t *Table) error {
	first, last, err := UsableRange(size)
	if err != nil {
		return err
	}
	n := uint64(size / SectorSize)
	entries, err := encodeEntries(t, first, last)
	if err != nil {
		return err
	}
	if t.DiskID.IsZero() {
		return errors.New("gpt: zero disk GUID")
	}
	entriesCRC := crc32.ChecksumIEEE(entries)

	// Backup: entries at last+1 .. n-2, header at n-1, in one write.
	backup := make([]byte, (entrySectors+1)*SectorSize)
	copy(backup, entries)
	putHeader(backup[entrySectors*SectorSize:], t.DiskID, n-1, 1, first, last, n-1-entrySectors, entriesCRC)
	// Primary: header at LBA 1, entries at LBA 2..33, in one write.
	primary := make([]byte, (entrySectors+1)*SectorSize)
	putHeader(primary, t.DiskID, 1, n-1, first, last, 2, entriesCRC)
	copy(primary[SectorSize:], entries)

	steps := []struct {
		what string
		buf  []byte
		off  int64
	}{
		{"backup table", backup, int64(n-1-entrySectors) * SectorSize},
		{"primary table", primary, SectorSize},
		{"protective MBR", protectiveMBR(n), 0},
	}
	for _, s := range steps {
		if _, err := w.WriteAt(s.buf, s.off); err != nil {
			return fmt.Errorf("gpt: write %s: %w", s.what, err)
		}
		if sy, ok := w.(syncer); ok {
			if err := sy.Sync(); err != nil {
				return fmt.Errorf("gpt: sync after %s: %w", s.what, err)
			}
		}
	}
	return nil
}

// encodeEntries validates t's partitions and returns the 16 KiB entry array.
func encodeEntries(t *Table, first, last uint64) ([]byte, error) {
	if len(t.Partitions) > EntryCount {
		return nil, fmt.Errorf("gpt: %d partitions, at most %d fit", len(t.Partitions), EntryCount)
	}
	buf := make([]byte, EntryCount*EntrySize)
	used := make(map[int]bool)
	ids := make(map[GUID]bool)
	sorted := make([]Partition, 0, len(t.Partitions))
	for i, p := range t.Partitions {
		slot := i
		if p.Number != 0 {
			slot = p.Number - 1
		}
		switch {
		case slot < 0 || slot >= EntryCount:
			return nil, fmt.Errorf("gpt: partition number %d out of range 1..%d", p.Number, EntryCount)
		case used[slot]:
			return nil, fmt.Errorf("gpt: two partitions with number %d", slot+1)
		case p.Type.IsZero():
			return nil, fmt.Errorf("gpt: partition %d has the zero type GUID, which marks an unused entry", slot+1)
		case p.ID.IsZero() || ids[p.ID]:
			return nil, fmt.Errorf("gpt: partition %d needs a unique non-zero GUID", slot+1)
		case p.FirstLBA%Alignment != 0:
			return nil, fmt.Errorf("gpt: partition %d starts at LBA %d, not on a 1 MiB boundary", slot+1, p.FirstLBA)
		case p.FirstLBA < first || p.LastLBA > last || p.FirstLBA > p.LastLBA:
			return nil, fmt.Errorf("gpt: partition %d (LBA %d..%d) outside the usable range %d..%d",
				slot+1, p.FirstLBA, p.LastLBA, first, last)
		}
		name := utf16.Encode([]rune(p.Name))
		if len(name) > maxNameUnits {
			return nil, fmt.Errorf("gpt: partition %d name %q longer than %d UTF-16 units", slot+1, p.Name, maxNameUnits)
		}
		used[slot], ids[p.ID] = true, true
		sorted = append(sorted, p)

		e := buf[slot*EntrySize : (slot+1)*EntrySize]
		copy(e[0:16], p.Type[:])
		copy(e[16:32], p.ID[:])
		binary.LittleEndian.PutUint64(e[32:], p.FirstLBA)
		binary.LittleEndian.PutUint64(e[40:], p.LastLBA)
		binary.LittleEndian.PutUint64(e[48:], p.Attributes)
		for j, u := range name {
			binary.LittleEndian.PutUint16(e[56+2*j:], u)
		}
	}
	if err := checkOverlap(sorted); err != nil {
		return nil, err
	}
	return buf, nil
}

func checkOverlap(ps []Partition) error {
	sort.Slice(ps, func(i, j int) bool { return ps[i].FirstLBA < ps[j].FirstLBA })
	for i := 1; i < len(ps); i++ {
		if ps[i].FirstLBA <= ps[i-1].LastLBA {
			return fmt.Errorf("gpt: partitions at LBA %d and %d overlap", ps[i-1].FirstLBA, ps[i].FirstLBA)
		}
	}
	return nil
}

// putHeader fills a 512-byte header sector.
func putHeader(b []byte, disk GUID, my, alt, first, last, entriesLBA uint64, entriesCRC uint32) {
	copy(b[0:8], signature)
	le := binary.LittleEndian
	le.PutUint32(b[8:], revision)
	le.PutUint32(b[12:], headerSize)
	le.PutUint64(b[24:], my)
	le.PutUint64(b[32:], alt)
	le.PutUint64(b[40:], first)
	le.PutUint64(b[48:], last)
	copy(b[56:72], disk[:])
	le.PutUint64(b[72:], entriesLBA)
	le.PutUint32(b[80:], EntryCount)
	le.PutUint32(b[84:], EntrySize)
	le.PutUint32(b[88:], entriesCRC)
	le.PutUint32(b[16:], crc32.ChecksumIEEE(b[:headerSize]))
}

// protectiveMBR returns LBA 0: one partition of type 0xEE from LBA 1 over
// the whole disk (capped at the 32-bit MBR limit), CHS fields saturated as
// UEFI allows.
func protectiveMBR(n uint64) []byte {
	b := make([]byte, SectorSize)
	e := b[446:462]
	e[1], e[2], e[3] = 0x00, 0x02, 0x00 // start CHS 0/0/2, i.e. LBA 1
	e[4] = 0xEE
	e[5], e[6], e[7] = 0xFF, 0xFF, 0xFF
	binary.LittleEndian.PutUint32(e[8:], 1)
	count := n - 1
	if count > 0xFFFFFFFF {
		count = 0xFFFFFFFF
	}
	binary.LittleEndian.PutUint32(e[12:], uint32(count))
	b[510], b[511] = 0x55, 0xAA
	return b
}

// Read reads the partition table of a disk of size bytes. It uses the
// primary header when it and its entry array are valid, otherwise the
// backup at the last LBA, and reports which it used and what was damaged
// in the Table's fields.
//
// Errors: ErrNoTable when there is no trace of a GPT; ErrCorrupt when there
// is one but neither copy is valid; ErrNoProtectiveMBR when a valid GPT sits
// behind a non-protective MBR; an I/O error as is.
func Read(r io.ReaderAt, size int64) (*Table, error) {
	if size < minSectors*SectorSize {
		return nil, fmt.Errorf("%w: %d bytes is too small for a GPT", ErrNoTable, size)
	}
	n := uint64(size / SectorSize)
	mbr := make([]byte, SectorSize)
	if err := readFull(r, mbr, 0); err != nil {
		return nil, err
	}
	mbrState := classifyMBR(mbr)

	prim, primErr := readCopy(r, n, 1, true)
	if isIO(primErr) {
		return nil, primErr
	}
	var t *readTable
	if primErr == nil {
		t = prim
		// The backup normally sits at the last LBA; after a disk grew it is
		// where the primary's alternate LBA points.
		alt := binary.LittleEndian.Uint64(prim.rawHeader[32:])
		back, backErr := readCopy(r, n, alt, false)
		if isIO(backErr) {
			return nil, backErr
		}
		t.BackupDamaged = backErr != nil || !sameTable(prim, back)
	} else {
		back, backErr := readCopy(r, n, n-1, false)
		if isIO(backErr) {
			return nil, backErr
		}
		if backErr != nil {
			if errors.Is(primErr, errNoSignature) && errors.Is(backErr, errNoSignature) && mbrState != mbrProtective {
				return nil, ErrNoTable
			}
			return nil, fmt.Errorf("%w: primary: %v; backup: %v", ErrCorrupt, primErr, backErr)
		}
		t = back
		t.UsedBackup = true
	}
	switch mbrState {
	case mbrZero:
		t.ProtectiveMBRMissing = true
	case mbrOther:
		return nil, ErrNoProtectiveMBR
	}
	return &t.Table, nil
}

type readTable struct {
	Table
	rawHeader  []byte
	entriesCRC uint32
}

func sameTable(a, b *readTable) bool {
	return a.DiskID == b.DiskID && a.entriesCRC == b.entriesCRC &&
		a.FirstUsableLBA == b.FirstUsableLBA && a.LastUsableLBA == b.LastUsableLBA
}

const (
	mbrZero = iota
	mbrProtective
	mbrOther
)

func classifyMBR(b []byte) int {
	if bytes.Equal(b, make([]byte, SectorSize)) {
		return mbrZero
	}
	if b[510] == 0x55 && b[511] == 0xAA {
		for i := 0; i < 4; i++ {
			if b[446+16*i+4] == 0xEE {
				return mbrProtective
			}
		}
	}
	return mbrOther
}

var errNoSignature = errors.New("no GPT signature")

// ioError marks errors from the reader, which Read passes on instead of
// treating them as a damaged table.
type ioError struct{ err error }

func (e ioError) Error() string { return "gpt: read: " + e.err.Error() }
func (e ioError) Unwrap() error { return e.err }

func isIO(err error) bool {
	var e ioError
	return errors.As(err, &e)
}

func readFull(r io.ReaderAt, b []byte, off int64) error {
	n, err := r.ReadAt(b, off)
	if n == len(b) {
		return nil
	}
	if err == nil || err == io.EOF {
		err = io.ErrUnexpectedEOF
	}
	return ioError{err}
}

// readCopy reads and validates the header at lba and its entry array.
func readCopy(r io.ReaderAt, n, lba uint64, primary bool) (*readTable, error) {
	if lba == 0 || lba >= n {
		return nil, fmt.Errorf("header LBA %d outside the disk", lba)
	}
	h := make([]byte, SectorSize)
	if err := readFull(r, h, int64(lba)*SectorSize); err != nil {
		return nil, err
	}
	if string(h[0:8]) != signature {
		return nil, errNoSignature
	}
	le := binary.LittleEndian
	if rev := le.Uint32(h[8:]); rev>>16 != 1 {
		return nil, fmt.Errorf("header at LBA %d: unsupported revision %#x", lba, rev)
	}
	hsize := le.Uint32(h[12:])
	if hsize < headerSize || hsize > SectorSize {
		return nil, fmt.Errorf("header at LBA %d: bad header size %d", lba, hsize)
	}
	want := le.Uint32(h[16:])
	c := append([]byte(nil), h[:hsize]...)
	clear(c[16:20])
	if got := crc32.ChecksumIEEE(c); got != want {
		return nil, fmt.Errorf("header at LBA %d: CRC %#08x, want %#08x", lba, got, want)
	}
	my, first, last := le.Uint64(h[24:]), le.Uint64(h[40:]), le.Uint64(h[48:])
	entriesLBA := le.Uint64(h[72:])
	count, esize := le.Uint32(h[80:]), le.Uint32(h[84:])
	if my != lba {
		return nil, fmt.Errorf("header at LBA %d says it is at LBA %d", lba, my)
	}
	if first > last || last >= n-1 || first < 2 {
		return nil, fmt.Errorf("header at LBA %d: bad usable range %d..%d", lba, first, last)
	}
	// Entry size is 128 * 2^k; only the first 128 bytes are interpreted.
	if esize < EntrySize || esize&(esize-1) != 0 || count == 0 || uint64(count)*uint64(esize) > maxEntryBytes {
		return nil, fmt.Errorf("header at LBA %d: bad entry array %d x %d bytes", lba, count, esize)
	}
	arrayBytes := uint64(count) * uint64(esize)
	arraySectors := (arrayBytes + SectorSize - 1) / SectorSize
	arrayEnd := entriesLBA + arraySectors - 1 // inclusive
	// The array lies between the header and the usable range (primary) or
	// between the usable range and the header (backup), never overlapping
	// either.
	if primary && (entriesLBA <= lba || arrayEnd >= first) ||
		!primary && (entriesLBA <= last || arrayEnd >= lba) {
		return nil, fmt.Errorf("header at LBA %d: entry array at LBA %d..%d overlaps the header or usable range", lba, entriesLBA, arrayEnd)
	}
	array := make([]byte, arraySectors*SectorSize)
	if err := readFull(r, array, int64(entriesLBA)*SectorSize); err != nil {
		return nil, err
	}
	array = array[:arrayBytes]
	crc := crc32.ChecksumIEEE(array)
	if crc != le.Uint32(h[88:]) {
		return nil, fmt.Errorf("header at LBA %d: entry array CRC %#08x, want %#08x", lba, crc, le.Uint32(h[88:]))
	}
	t := &readTable{rawHeader: h, entriesCRC: crc}
	copy(t.DiskID[:], h[56:72])
	t.FirstUsableLBA, t.LastUsableLBA = first, last
	for i := 0; i < int(count); i++ {
		e := array[i*int(esize):]
		var p Partition
		copy(p.Type[:], e[0:16])
		if p.Type.IsZero() {
			continue
		}
		copy(p.ID[:], e[16:32])
		p.FirstLBA, p.LastLBA, p.Attributes = le.Uint64(e[32:]), le.Uint64(e[40:]), le.Uint64(e[48:])
		p.Name = decodeName(e[56:128])
		p.Number = i + 1
		if p.FirstLBA > p.LastLBA || p.FirstLBA < first || p.LastLBA > last {
			return nil, fmt.Errorf("header at LBA %d: partition %d (LBA %d..%d) outside the usable range %d..%d",
				lba, p.Number, p.FirstLBA, p.LastLBA, first, last)
		}
		t.Partitions = append(t.Partitions, p)
	}
	if err := checkOverlap(append([]Partition(nil), t.Partitions...)); err != nil {
		return nil, fmt.Errorf("header at LBA %d: %v", lba, strings.TrimPrefix(err.Error(), "gpt: "))
	}
	return t, nil
}

func decodeName(b []byte) string {
	units := make([]uint16, 0, maxNameUnits)
	for i := 0; i+1 < len(b); i += 2 {
		u := binary.LittleEndian.Uint16(b[i:])
		if u == 0 {
			break
		}
		units = append(units, u)
	}
	return string(utf16.Decode(units))
}
