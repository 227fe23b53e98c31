// Package uki builds and reads Unified Kernel Images (UKIs) on systemd's EFI
// stub.
//
// A UKI is one PE/COFF EFI executable that carries everything needed to boot
// a Linux system: the systemd-stub code (systemd-boot-efi's
// linuxx64.efi.stub) plus extra PE sections holding the kernel (.linux), the
// initrd (.initrd), the kernel command line (.cmdline), os-release (.osrel)
// and so on. The firmware loads and, under Secure Boot, verifies the single
// file; the stub then finds its own sections in memory, measures them into
// TPM PCR 11 and hands the kernel, command line and initrd over to Linux.
// Signing or measuring the UKI therefore covers the whole boot payload.
//
// Layout of a UKI written by [Build] (offsets for Debian 12's systemd 252
// stub: FileAlignment and SectionAlignment 0x200, SizeOfHeaders 0x400):
//
//	file offset                                 virtual address
//	0x0      +--------------------------------+
//	         | MZ header, DOS stub            |
//	         | PE signature, COFF header,     |
//	         | PE32+ optional header          |
//	         | section table:                 |
//	         |   8 stub section headers       |
//	         |   + 1 header per added section |  (written into the zero
//	         |     (40 bytes each)            |   padding of the headers)
//	0x400    +--------------------------------+ SizeOfHeaders
//	         | .text .reloc .data .dynamic    |  0x4000 ... 0x19134
//	         | .rela .dynsym .sbat .sdmagic   |  stub sections, unchanged
//	0x11400  +--------------------------------+ 0x19400 (first SectionAlignment
//	         | added section 1 (e.g. .osrel)  |  boundary past the stub's
//	         +--------------------------------+  SizeOfImage 0x19300)
//	         | added section 2 (.cmdline)     |
//	         +--------------------------------+
//	         | ...  .linux  (the kernel)      |
//	         +--------------------------------+
//	         | ...  .initrd                   |
//	         +--------------------------------+ end of file; SizeOfImage is
//	                                              the aligned end in memory
//
// Each added section starts on a FileAlignment boundary in the file and on a
// SectionAlignment boundary in memory, in the order given; its raw data is
// zero-padded to FileAlignment and its VirtualSize is the exact data length.
// The COFF symbol table that objcopy left at the end of the stub file is
// dropped (see [Build]).
//
// Why this package writes the PE itself instead of running objcopy or
// systemd's ukify: the bytes of a UKI are what Secure Boot signs, what the
// firmware measures into PCR 4 and what the stub measures into PCR 11, so
// they must be a pure function of the inputs. Writing the few header fields
// by hand makes the output byte-reproducible (no timestamps, no tool-version
// dependent layout), needs no binutils or Python on the build host, and lets
// the build predict PCR 11 ([PredictPCR11]) and the Authenticode digest
// ([AuthenticodeSHA256]) from the same code that wrote the image.
package uki

import (
	"bytes"
	"crypto/sha256"
	"debug/pe"
	"encoding/binary"
	"errors"
	"fmt"
	"math"
)

// Section is one added PE section of a UKI.
type Section struct {
	Name string // e.g. ".linux"; at most 8 bytes
	Data []byte
}

// Standard section names the stub knows (systemd 252), in the order the stub
// measures them into PCR 11.
const (
	// Linux holds the kernel image (an x86 bzImage / EFI-stub kernel).
	Linux = ".linux"
	// OSRel holds the os-release file of the booted system.
	OSRel = ".osrel"
	// Cmdline holds the kernel command line.
	Cmdline = ".cmdline"
	// Initrd holds the initrd (cpio archive, possibly compressed).
	Initrd = ".initrd"
	// Splash holds a BMP boot splash image.
	Splash = ".splash"
	// DTB holds a devicetree blob.
	DTB = ".dtb"
	// PCRSig holds signed PCR 11 policies (JSON); never measured.
	PCRSig = ".pcrsig"
	// PCRPKey holds the public key for the .pcrsig policies.
	PCRPKey = ".pcrpkey"
	// Uname holds the kernel release ("uname -r").
	Uname = ".uname" // not known to 252's stub: carried, not measured
)

// MeasuredOrder is the order in which systemd-stub 252 measures sections into
// PCR 11 (.pcrsig excluded).
var MeasuredOrder = []string{Linux, OSRel, Cmdline, Initrd, Splash, DTB, PCRPKey}

// stubSections are all names systemd-stub 252 looks up (its
// unified_sections[] table). The stub compares only strlen(name) bytes of
// a section header's name, so ".linux" also matches a section ".linux2"; and
// when several sections match, the last one in the section table wins.
var stubSections = []string{Linux, OSRel, Cmdline, Initrd, Splash, DTB, PCRSig, PCRPKey}

// PE/COFF constants used here.
const (
	sectionHeaderSize = 40
	coffHeaderSize    = 20
	symbolSize        = 18 // one COFF symbol table record

	magicPE32     = 0x10b
	magicPE32Plus = 0x20b

	certTableIndex = 4 // IMAGE_DIRECTORY_ENTRY_SECURITY

	fileLocalSymsStripped = 0x0008 // IMAGE_FILE_LOCAL_SYMS_STRIPPED

	scnCntInitializedData = 0x00000040 // IMAGE_SCN_CNT_INITIALIZED_DATA
	scnMemRead            = 0x40000000 // IMAGE_SCN_MEM_READ
	addedCharacteristics  = scnCntInitializedData | scnMemRead

	// Offsets inside the optional header, equal for PE32 and PE32+.
	optSizeOfInitializedData = 8
	optSectionAlignment      = 32
	optFileAlignment         = 36
	optSizeOfImage           = 56
	optSizeOfHeaders         = 60
	optCheckSum              = 64
)

// rawSection is one section table entry as stored in the file.
type rawSection struct {
	name             [8]byte
	virtualSize      uint32
	virtualAddress   uint32
	sizeOfRawData    uint32
	pointerToRawData uint32
}

// nameString returns the header's name up to the first NUL byte.
func (s *rawSection) nameString() string {
	if i := bytes.IndexByte(s.name[:], 0); i >= 0 {
		return string(s.name[:i])
	}
	return string(s.name[:])
}

// memSize is how much the loader maps for the section.
func (s *rawSection) memSize() uint32 {
	if s.virtualSize == 0 {
		return s.sizeOfRawData
	}
	return s.virtualSize
}

// headers are the parts of a PE image this package reads or rewrites, with
// the file offsets of the fields it patches.
type headers struct {
	coffOff      int // COFF file header (just after "PE\0\0")
	optOff       int // optional header
	sectTableOff int // first section header
	magic        uint16
	sections     []rawSection

	sizeOfHeaders uint32
	fileAlign     uint32
	sectAlign     uint32
	sizeOfImage   uint32

	checksumOff int // CheckSum field
	certDirOff  int // Certificate Table data directory entry; -1 if absent
	certOff     uint32
	certSize    uint32

	symPtr  uint32 // PointerToSymbolTable
	numSyms uint32 // NumberOfSymbols
}

// checksumOffset returns the file offset of the optional header's CheckSum
// field, or -1 if image has no recognisable PE header.
func checksumOffset(image []byte) int {
	if len(image) < 0x40 || image[0] != 'M' || image[1] != 'Z' {
		return -1
	}
	peOff := int64(binary.LittleEndian.Uint32(image[0x3c:]))
	off := peOff + 4 + coffHeaderSize + optCheckSum
	if off+4 > int64(len(image)) || !bytes.Equal(image[peOff:peOff+4], []byte("PE\x00\x00")) {
		return -1
	}
	return int(off)
}

// parseHeaders decodes the DOS, COFF and optional headers and the section
// table of image. It checks that all of them lie inside image, but not where
// section data lies.
func parseHeaders(image []byte) (*headers, error) {
	if len(image) < 0x40 || image[0] != 'M' || image[1] != 'Z' {
		return nil, errors.New("not a PE image: no MZ header")
	}
	peOff := int64(binary.LittleEndian.Uint32(image[0x3c:]))
	if peOff+4+coffHeaderSize > int64(len(image)) || !bytes.Equal(image[peOff:peOff+4], []byte("PE\x00\x00")) {
		return nil, errors.New("not a PE image: no PE signature")
	}
	h := &headers{coffOff: int(peOff) + 4}
	coff := image[h.coffOff:]
	nsect := int(binary.LittleEndian.Uint16(coff[2:]))
	h.symPtr = binary.LittleEndian.Uint32(coff[8:])
	h.numSyms = binary.LittleEndian.Uint32(coff[12:])
	optSize := int(binary.LittleEndian.Uint16(coff[16:]))
	h.optOff = h.coffOff + coffHeaderSize
	h.sectTableOff = h.optOff + optSize
	if h.sectTableOff+nsect*sectionHeaderSize > len(image) {
		return nil, errors.New("not a PE image: headers truncated")
	}
	if optSize < 2 {
		return nil, errors.New("not a PE image: no optional header")
	}
	opt := image[h.optOff:h.sectTableOff]
	h.magic = binary.LittleEndian.Uint16(opt)
	var dirOff, nDirOff int
	switch h.magic {
	case magicPE32:
		nDirOff, dirOff = 92, 96
	case magicPE32Plus:
		nDirOff, dirOff = 108, 112
	default:
		return nil, fmt.Errorf("not a PE image: optional header magic %#x", h.magic)
	}
	if optSize < nDirOff+4 {
		return nil, fmt.Errorf("optional header too short (%d bytes)", optSize)
	}
	h.sectAlign = binary.LittleEndian.Uint32(opt[optSectionAlignment:])
	h.fileAlign = binary.LittleEndian.Uint32(opt[optFileAlignment:])
	h.sizeOfImage = binary.LittleEndian.Uint32(opt[optSizeOfImage:])
	h.sizeOfHeaders = binary.LittleEndian.Uint32(opt[optSizeOfHeaders:])
	h.checksumOff = h.optOff + optCheckSum
	h.certDirOff = -1
	nDirs := int(binary.LittleEndian.Uint32(opt[nDirOff:]))
	if nDirs > certTableIndex && dirOff+(certTableIndex+1)*8 <= optSize {
		h.certDirOff = h.optOff + dirOff + certTableIndex*8
		h.certOff = binary.LittleEndian.Uint32(image[h.certDirOff:])
		h.certSize = binary.LittleEndian.Uint32(image[h.certDirOff+4:])
	}
	if int64(h.sizeOfHeaders) > int64(len(image)) {
		return nil, fmt.Errorf("SizeOfHeaders %#x beyond end of file (%#x)", h.sizeOfHeaders, len(image))
	}
	h.sections = make([]rawSection, nsect)
	for i := range h.sections {
		b := image[h.sectTableOff+i*sectionHeaderSize:]
		s := &h.sections[i]
		copy(s.name[:], b[:8])
		s.virtualSize = binary.LittleEndian.Uint32(b[8:])
		s.virtualAddress = binary.LittleEndian.Uint32(b[12:])
		s.sizeOfRawData = binary.LittleEndian.Uint32(b[16:])
		s.pointerToRawData = binary.LittleEndian.Uint32(b[20:])
	}
	return h, nil
}

// parse decodes the headers of image and validates it with debug/pe.
func parse(image []byte) (*headers, error) {
	h, err := parseHeaders(image)
	if err != nil {
		return nil, err
	}
	if err := checkPE(image); err != nil {
		return nil, err
	}
	return h, nil
}

// checkPE has debug/pe parse image.
func checkPE(image []byte) error {
	f, err := pe.NewFile(bytes.NewReader(image))
	if err != nil {
		return fmt.Errorf("not a valid PE image: %w", err)
	}
	return f.Close()
}

// rawRange returns the section's raw data inside image.
func rawRange(image []byte, s *rawSection) ([]byte, error) {
	end := int64(s.pointerToRawData) + int64(s.sizeOfRawData)
	if end > int64(len(image)) {
		return nil, fmt.Errorf("section %q raw data [%#x, %#x) beyond end of file (%#x)",
			s.nameString(), s.pointerToRawData, end, len(image))
	}
	return image[s.pointerToRawData:end], nil
}

// memData returns the section as it is in memory after loading: exactly
// VirtualSize bytes, the raw data followed by zeros where VirtualSize
// exceeds SizeOfRawData.
func memData(image []byte, s *rawSection) ([]byte, error) {
	raw, err := rawRange(image, s)
	if err != nil {
		return nil, err
	}
	out := make([]byte, s.virtualSize)
	copy(out, raw)
	return out, nil
}

// stubKey returns the section name systemd-stub 252 takes a section called
// name for ("" if none): the stub compares only the length of its own name.
func stubKey(name []byte) string {
	for _, k := range stubSections {
		if bytes.HasPrefix(name, []byte(k)) {
			return k
		}
	}
	return ""
}

// validName checks the name of a section to be added.
func validName(name string) error {
	switch {
	case name == "":
		return errors.New("empty section name")
	case len(name) > 8:
		return fmt.Errorf("section name %q longer than 8 bytes", name)
	case bytes.IndexByte([]byte(name), 0) >= 0:
		return fmt.Errorf("section name %q contains a NUL byte", name)
	case name[0] == '/':
		return fmt.Errorf("section name %q starts with '/' (a string table reference)", name)
	}
	if k := stubKey([]byte(name)); k != "" && k != name {
		return fmt.Errorf("section name %q would be taken for %q by systemd-stub (it matches name prefixes)", name, k)
	}
	return nil
}

// allZero reports whether b holds only zero bytes.
func allZero(b []byte) bool {
	for _, c := range b {
		if c != 0 {
			return false
		}
	}
	return true
}

func isPow2(x uint32) bool { return x != 0 && x&(x-1) == 0 }

func alignUp(x, a uint64) uint64 { return (x + a - 1) &^ (a - 1) }

// Build returns a PE image: the stub's headers and sections unchanged in
// content, followed by the given sections in the order given.
//
// The stub must be a PE32+ image without a certificate table (unsigned), its
// section table must have room for the new headers below SizeOfHeaders and
// the first section's data, and section names must be 1 to 8 bytes, unique,
// and not a longer variant of a name the stub looks up (".linux2" would be
// used as ".linux" by systemd-stub 252, which compares name prefixes).
// Empty sections are refused: the stub treats a zero-size section as absent.
//
// Header fields changed: NumberOfSections, SizeOfImage,
// SizeOfInitializedData and CheckSum. If the stub ends in a COFF symbol and
// string table (Debian's 252 stub does: objcopy keeps one, although images
// should not have one), it is dropped, as ukify does: PointerToSymbolTable
// and NumberOfSymbols become 0 and IMAGE_FILE_LOCAL_SYMS_STRIPPED is set.
// Keeping it would leave a gap between the stub's and the added sections'
// data, which Authenticode does not hash and which sbsign and firmware treat
// differently. Any other non-zero data after the stub's last section is an
// error.
//
// Added sections start at the first SectionAlignment boundary at or past
// both the end of the stub's last section and the stub's SizeOfImage (the
// 252 stub declares 0x19300 although its last section ends at 0x19134).
func Build(stub []byte, sections []Section) ([]byte, error) {
	h, err := parseHeaders(stub)
	if err != nil {
		return nil, fmt.Errorf("uki: stub: %w", err)
	}
	if h.magic != magicPE32Plus {
		return nil, fmt.Errorf("uki: stub is not PE32+ (optional header magic %#x)", h.magic)
	}
	if err := checkPE(stub); err != nil {
		return nil, fmt.Errorf("uki: stub: %w", err)
	}
	if h.certOff != 0 || h.certSize != 0 {
		return nil, errors.New("uki: stub has a certificate table (is signed); use an unsigned stub")
	}
	if len(sections) == 0 {
		return nil, errors.New("uki: no sections to add")
	}
	if !isPow2(h.fileAlign) || !isPow2(h.sectAlign) {
		return nil, fmt.Errorf("uki: stub alignments not powers of two (file %#x, section %#x)", h.fileAlign, h.sectAlign)
	}

	// Names: unique among stub and new sections, and each name the stub
	// looks up present at most once.
	seen := map[string]bool{}
	keys := map[string]string{}
	for i := range h.sections {
		s := &h.sections[i]
		seen[s.nameString()] = true
		if k := stubKey(s.name[:]); k != "" {
			keys[k] = s.nameString()
		}
	}
	for _, s := range sections {
		if err := validName(s.Name); err != nil {
			return nil, fmt.Errorf("uki: %w", err)
		}
		if seen[s.Name] {
			return nil, fmt.Errorf("uki: duplicate section %q", s.Name)
		}
		if k := stubKey([]byte(s.Name)); k != "" {
			if other, ok := keys[k]; ok {
				return nil, fmt.Errorf("uki: section %q conflicts with existing section %q", s.Name, other)
			}
			keys[k] = s.Name
		}
		if len(s.Data) == 0 {
			return nil, fmt.Errorf("uki: section %q is empty", s.Name)
		}
		seen[s.Name] = true
	}

	// Extent of the stub: raw data in the file, sections in memory.
	rawEnd := uint64(h.sizeOfHeaders)
	firstRaw := uint64(h.sizeOfHeaders)
	memEnd := uint64(h.sizeOfImage)
	for i := range h.sections {
		s := &h.sections[i]
		if s.sizeOfRawData > 0 {
			if _, err := rawRange(stub, s); err != nil {
				return nil, fmt.Errorf("uki: stub: %w", err)
			}
			rawEnd = max(rawEnd, uint64(s.pointerToRawData)+uint64(s.sizeOfRawData))
			firstRaw = min(firstRaw, uint64(s.pointerToRawData))
		}
		memEnd = max(memEnd, uint64(s.virtualAddress)+uint64(s.memSize()))
	}

	// Room for the new section headers.
	tableEnd := uint64(h.sectTableOff) + uint64(len(h.sections)+len(sections))*sectionHeaderSize
	if tableEnd > firstRaw {
		return nil, fmt.Errorf("uki: no room for %d more section headers: section table would end at %#x, past SizeOfHeaders/first section data at %#x",
			len(sections), tableEnd, firstRaw)
	}
	oldTableEnd := h.sectTableOff + len(h.sections)*sectionHeaderSize
	if !allZero(stub[oldTableEnd:tableEnd]) {
		return nil, fmt.Errorf("uki: stub header bytes [%#x, %#x) after the section table are not free (non-zero)", oldTableEnd, tableEnd)
	}

	// Whatever follows the stub's last section: a COFF symbol table at the
	// end of the file (dropped) and zeros.
	tail := stub[rawEnd:]
	stripSyms := false
	if h.symPtr != 0 {
		symEnd, ok := symbolTableEnd(stub, h)
		if !ok || uint64(h.symPtr) < rawEnd || symEnd != uint64(len(stub)) {
			return nil, fmt.Errorf("uki: stub has a COFF symbol table at %#x that is not at the end of the file", h.symPtr)
		}
		tail = stub[rawEnd:h.symPtr]
		stripSyms = true
	}
	if !allZero(tail) {
		return nil, fmt.Errorf("uki: stub has %d bytes of unknown data after its last section", len(tail))
	}

	// Layout of the new sections.
	fa, sa := uint64(h.fileAlign), uint64(h.sectAlign)
	added := make([]rawSection, len(sections))
	filePos := alignUp(rawEnd, fa)
	memPos := alignUp(memEnd, sa)
	var addedInit uint64
	for i, s := range sections {
		size := uint64(len(s.Data))
		rawSize := alignUp(size, fa)
		if filePos+rawSize > math.MaxUint32 || memPos+size > math.MaxUint32 {
			return nil, errors.New("uki: image would exceed 4 GiB")
		}
		r := &added[i]
		copy(r.name[:], s.Name)
		r.virtualSize = uint32(size)
		r.virtualAddress = uint32(memPos)
		r.sizeOfRawData = uint32(rawSize)
		r.pointerToRawData = uint32(filePos)
		addedInit += rawSize
		filePos += rawSize
		memPos = alignUp(memPos+size, sa)
	}
	if memPos > math.MaxUint32 {
		return nil, errors.New("uki: image would exceed 4 GiB")
	}

	out := make([]byte, filePos)
	copy(out, stub[:rawEnd])
	for i, r := range added {
		b := out[oldTableEnd+i*sectionHeaderSize:]
		copy(b[:8], r.name[:])
		binary.LittleEndian.PutUint32(b[8:], r.virtualSize)
		binary.LittleEndian.PutUint32(b[12:], r.virtualAddress)
		binary.LittleEndian.PutUint32(b[16:], r.sizeOfRawData)
		binary.LittleEndian.PutUint32(b[20:], r.pointerToRawData)
		// PointerToRelocations, PointerToLinenumbers, NumberOf*: zero.
		binary.LittleEndian.PutUint32(b[36:], addedCharacteristics)
		copy(out[r.pointerToRawData:], sections[i].Data)
	}

	coff := out[h.coffOff:]
	binary.LittleEndian.PutUint16(coff[2:], uint16(len(h.sections)+len(added)))
	if stripSyms {
		binary.LittleEndian.PutUint32(coff[8:], 0)
		binary.LittleEndian.PutUint32(coff[12:], 0)
		ch := binary.LittleEndian.Uint16(coff[18:])
		binary.LittleEndian.PutUint16(coff[18:], ch|fileLocalSymsStripped)
	}
	opt := out[h.optOff:]
	init := uint64(binary.LittleEndian.Uint32(opt[optSizeOfInitializedData:])) + addedInit
	if init > math.MaxUint32 {
		return nil, errors.New("uki: SizeOfInitializedData would exceed 4 GiB")
	}
	binary.LittleEndian.PutUint32(opt[optSizeOfInitializedData:], uint32(init))
	binary.LittleEndian.PutUint32(opt[optSizeOfImage:], uint32(memPos))
	binary.LittleEndian.PutUint32(opt[optCheckSum:], 0)
	binary.LittleEndian.PutUint32(opt[optCheckSum:], Checksum(out))
	return out, nil
}

// symbolTableEnd returns where the COFF symbol table and the string table
// after it end.
func symbolTableEnd(image []byte, h *headers) (uint64, bool) {
	strOff := uint64(h.symPtr) + uint64(h.numSyms)*symbolSize
	if strOff+4 > uint64(len(image)) {
		return 0, false
	}
	strSize := uint64(binary.LittleEndian.Uint32(image[strOff:]))
	if strSize < 4 {
		strSize = 4 // the size field itself
	}
	return strOff + strSize, true
}

// Read returns the sections of a PE image (all of them, stub's included, in
// table order) with Data = exactly VirtualSize bytes (VirtualSize may exceed
// SizeOfRawData: the rest is zeros, as in memory).
//
// Names are the section headers' 8-byte name fields up to the first NUL, as
// the stub sees them (no COFF string table lookup).
func Read(image []byte) ([]Section, error) {
	h, err := parse(image)
	if err != nil {
		return nil, fmt.Errorf("uki: %w", err)
	}
	out := make([]Section, len(h.sections))
	for i := range h.sections {
		s := &h.sections[i]
		data, err := memData(image, s)
		if err != nil {
			return nil, fmt.Errorf("uki: %w", err)
		}
		out[i] = Section{Name: s.nameString(), Data: data}
	}
	return out, nil
}

// PredictPCR11 returns the SHA-256 PCR 11 value systemd-stub 252 produces
// when it boots image: starting from 32 zero bytes, for each name in
// MeasuredOrder present among the image's sections: extend with
// sha256(name + "\x00"), then extend with sha256(section data of VirtualSize
// bytes). extend(pcr, d) = sha256(pcr || d).
//
// "Present" is decided as the 252 stub does: a section header matches name
// if its name field starts with name, the last matching header in the table
// wins, and a section with VirtualSize 0 counts as absent. [Build] refuses
// names for which this differs from exact matching.
func PredictPCR11(image []byte) ([]byte, error) {
	h, err := parse(image)
	if err != nil {
		return nil, fmt.Errorf("uki: %w", err)
	}
	pcr := make([]byte, sha256.Size)
	extend := func(d [sha256.Size]byte) {
		pcr = append(pcr, d[:]...)
		sum := sha256.Sum256(pcr)
		pcr = append(pcr[:0], sum[:]...)
	}
	for _, name := range MeasuredOrder {
		var found *rawSection
		for i := range h.sections {
			if bytes.HasPrefix(h.sections[i].name[:], []byte(name)) {
				found = &h.sections[i]
			}
		}
		if found == nil || found.virtualSize == 0 {
			continue
		}
		data, err := memData(image, found)
		if err != nil {
			return nil, fmt.Errorf("uki: %w", err)
		}
		extend(sha256.Sum256(append([]byte(name), 0)))
		extend(sha256.Sum256(data))
	}
	return pcr, nil
}
