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
