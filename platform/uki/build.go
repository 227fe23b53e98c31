package uki

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"math"
)

// Writing a UKI. Build checks the stub and the sections to add, then
// lays the image out in steps that each fill in their part of a plan
// (where the stub ends, room for the new headers, what follows the stub,
// where each new section goes) and writes it: each layout decision is
// named and checked on its own, and the bytes written are a function of
// the plan alone.

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
	h, err := parseStub(stub)
	if err != nil {
		return nil, err
	}
	if len(sections) == 0 {
		return nil, errors.New("uki: no sections to add")
	}
	if !isPow2(h.fileAlign) || !isPow2(h.sectAlign) {
		return nil, fmt.Errorf("uki: stub alignments not powers of two (file %#x, section %#x)", h.fileAlign, h.sectAlign)
	}
	if err := checkNames(h, sections); err != nil {
		return nil, err
	}
	p := &plan{stub: stub, h: h}
	if err := p.measureStub(); err != nil {
		return nil, err
	}
	if err := p.reserveHeaders(len(sections)); err != nil {
		return nil, err
	}
	if err := p.checkTail(); err != nil {
		return nil, err
	}
	if err := p.place(sections); err != nil {
		return nil, err
	}
	return p.write(sections)
}

// parseStub parses the stub's headers and checks it is a PE32+ image
// debug/pe reads, and unsigned.
func parseStub(stub []byte) (*headers, error) {
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
	return h, nil
}

// checkNames checks the names of the sections to add: unique among stub
// and new sections, each name the stub looks up present at most once,
// and no section empty.
func checkNames(h *headers, sections []Section) error {
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
			return fmt.Errorf("uki: %w", err)
		}
		if seen[s.Name] {
			return fmt.Errorf("uki: duplicate section %q", s.Name)
		}
		if k := stubKey([]byte(s.Name)); k != "" {
			if other, ok := keys[k]; ok {
				return fmt.Errorf("uki: section %q conflicts with existing section %q", s.Name, other)
			}
			keys[k] = s.Name
		}
		if len(s.Data) == 0 {
			return fmt.Errorf("uki: section %q is empty", s.Name)
		}
		seen[s.Name] = true
	}
	return nil
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

// plan is how Build lays a UKI out: filled in by its steps in order,
// measureStub, reserveHeaders, checkTail and place, then written by
// write.
type plan struct {
	stub []byte
	h    *headers

	// measureStub: the stub's extent.
	rawEnd   uint64 // end of the stub's section data in the file
	firstRaw uint64 // start of its first section's data (or SizeOfHeaders)
	memEnd   uint64 // end of the stub in memory, at least its SizeOfImage

	// reserveHeaders: the stub's section table ends here; the added
	// headers follow it.
	oldTableEnd int

	// checkTail: drop the COFF symbol table after the last section.
	stripSyms bool

	// place: the added sections' headers, the file's size, SizeOfImage,
	// and the raw bytes added (SizeOfInitializedData grows by them).
	added       []rawSection
	fileSize    uint64
	sizeOfImage uint64
	addedInit   uint64
}

// measureStub finds the extent of the stub: its sections' raw data in the
// file, its sections in memory.
func (p *plan) measureStub() error {
	h := p.h
	p.rawEnd = uint64(h.sizeOfHeaders)
	p.firstRaw = uint64(h.sizeOfHeaders)
	p.memEnd = uint64(h.sizeOfImage)
	for i := range h.sections {
		s := &h.sections[i]
		if s.sizeOfRawData > 0 {
			if _, err := rawRange(p.stub, s); err != nil {
				return fmt.Errorf("uki: stub: %w", err)
			}
			p.rawEnd = max(p.rawEnd, uint64(s.pointerToRawData)+uint64(s.sizeOfRawData))
			p.firstRaw = min(p.firstRaw, uint64(s.pointerToRawData))
		}
		p.memEnd = max(p.memEnd, uint64(s.virtualAddress)+uint64(s.memSize()))
	}
	return nil
}

// reserveHeaders checks there is room for n more section headers: zeros
// between the section table and the first section's data.
func (p *plan) reserveHeaders(n int) error {
	h := p.h
	tableEnd := uint64(h.sectTableOff) + uint64(len(h.sections)+n)*sectionHeaderSize
	if tableEnd > p.firstRaw {
		return fmt.Errorf("uki: no room for %d more section headers: section table would end at %#x, past SizeOfHeaders/first section data at %#x",
			n, tableEnd, p.firstRaw)
	}
	p.oldTableEnd = h.sectTableOff + len(h.sections)*sectionHeaderSize
	if !allZero(p.stub[p.oldTableEnd:tableEnd]) {
		return fmt.Errorf("uki: stub header bytes [%#x, %#x) after the section table are not free (non-zero)", p.oldTableEnd, tableEnd)
	}
	return nil
}

// checkTail checks what follows the stub's last section: a COFF symbol
// table at the end of the file (dropped) and zeros.
func (p *plan) checkTail() error {
	h := p.h
	tail := p.stub[p.rawEnd:]
	if h.symPtr != 0 {
		symEnd, ok := symbolTableEnd(p.stub, h)
		if !ok || uint64(h.symPtr) < p.rawEnd || symEnd != uint64(len(p.stub)) {
			return fmt.Errorf("uki: stub has a COFF symbol table at %#x that is not at the end of the file", h.symPtr)
		}
		tail = p.stub[p.rawEnd:h.symPtr]
		p.stripSyms = true
	}
	if !allZero(tail) {
		return fmt.Errorf("uki: stub has %d bytes of unknown data after its last section", len(tail))
	}
	return nil
}

// place lays the new sections out after the stub's, each on a
// FileAlignment boundary in the file and a SectionAlignment boundary in
// memory.
func (p *plan) place(sections []Section) error {
	fa, sa := uint64(p.h.fileAlign), uint64(p.h.sectAlign)
	p.added = make([]rawSection, len(sections))
	filePos := alignUp(p.rawEnd, fa)
	memPos := alignUp(p.memEnd, sa)
	for i, s := range sections {
		size := uint64(len(s.Data))
		rawSize := alignUp(size, fa)
		if filePos+rawSize > math.MaxUint32 || memPos+size > math.MaxUint32 {
			return errors.New("uki: image would exceed 4 GiB")
		}
		r := &p.added[i]
		copy(r.name[:], s.Name)
		r.virtualSize = uint32(size)
		r.virtualAddress = uint32(memPos)
		r.sizeOfRawData = uint32(rawSize)
		r.pointerToRawData = uint32(filePos)
		p.addedInit += rawSize
		filePos += rawSize
		memPos = alignUp(memPos+size, sa)
	}
	if memPos > math.MaxUint32 {
		return errors.New("uki: image would exceed 4 GiB")
	}
	p.fileSize, p.sizeOfImage = filePos, memPos
	return nil
}

// write returns the image: the stub up to its last section's data, the
// added headers and sections, and the header fields Build changes.
func (p *plan) write(sections []Section) ([]byte, error) {
	h := p.h
	out := make([]byte, p.fileSize)
	copy(out, p.stub[:p.rawEnd])
	for i, r := range p.added {
		b := out[p.oldTableEnd+i*sectionHeaderSize:]
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
	binary.LittleEndian.PutUint16(coff[2:], uint16(len(h.sections)+len(p.added)))
	if p.stripSyms {
		binary.LittleEndian.PutUint32(coff[8:], 0)
		binary.LittleEndian.PutUint32(coff[12:], 0)
		ch := binary.LittleEndian.Uint16(coff[18:])
		binary.LittleEndian.PutUint16(coff[18:], ch|fileLocalSymsStripped)
	}
	opt := out[h.optOff:]
	init := uint64(binary.LittleEndian.Uint32(opt[optSizeOfInitializedData:])) + p.addedInit
	if init > math.MaxUint32 {
		return nil, errors.New("uki: SizeOfInitializedData would exceed 4 GiB")
	}
	binary.LittleEndian.PutUint32(opt[optSizeOfInitializedData:], uint32(init))
	binary.LittleEndian.PutUint32(opt[optSizeOfImage:], uint32(p.sizeOfImage))
	binary.LittleEndian.PutUint32(opt[optCheckSum:], 0)
	binary.LittleEndian.PutUint32(opt[optCheckSum:], Checksum(out))
	return out, nil
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
