package efivar

import (
	"encoding/binary"
	"errors"
	"fmt"
	"os"
	"sort"
	"strconv"
	"strings"
)

// LoadOptionActive is the attribute of an entry the firmware may boot.
const LoadOptionActive uint32 = 0x1

// LoadOption is an EFI_LOAD_OPTION (the value of a Boot#### variable).
type LoadOption struct {
	Attributes  uint32
	Description string
	// FilePath is the device path list, raw (HardDrivePath + FilePath +
	// End, as BootPath makes).
	FilePath []byte
	// OptionalData follows the device path; for a UKI, systemd-stub takes
	// it as the kernel command line. Plinth's entries leave it empty.
	OptionalData []byte
}

// Marshal encodes the load option.
func (o LoadOption) Marshal() []byte {
	b := binary.LittleEndian.AppendUint32(nil, o.Attributes)
	b = binary.LittleEndian.AppendUint16(b, uint16(len(o.FilePath)))
	b = append(b, utf16z(o.Description)...)
	b = append(b, o.FilePath...)
	return append(b, o.OptionalData...)
}

// ParseLoadOption decodes a Boot#### value.
func ParseLoadOption(b []byte) (LoadOption, error) {
	var o LoadOption
	if len(b) < 6 {
		return o, fmt.Errorf("efivar: load option of %d bytes", len(b))
	}
	o.Attributes = binary.LittleEndian.Uint32(b)
	n := int(binary.LittleEndian.Uint16(b[4:]))
	desc, used, err := readUTF16z(b[6:])
	if err != nil {
		return o, fmt.Errorf("efivar: load option description: %w", err)
	}
	o.Description = desc
	rest := b[6+used:]
	if n > len(rest) {
		return o, fmt.Errorf("efivar: load option device path of %d bytes, %d left", n, len(rest))
	}
	o.FilePath = append([]byte(nil), rest[:n]...)
	if len(rest) > n {
		o.OptionalData = append([]byte(nil), rest[n:]...)
	}
	return o, nil
}

// Device path node types (UEFI 10.3).
const (
	mediaType       = 0x04
	hardDriveSub    = 0x01
	filePathSub     = 0x04
	endType         = 0x7f
	endEntireSub    = 0xff
	gptFormat       = 0x02 // PartitionFormat: GUID partition table
	guidSignature   = 0x02 // SignatureType: GUID
	hardDriveLength = 42
)

// HardDrive is a GPT partition as a device path names it.
type HardDrive struct {
	Number          uint32
	StartLBA, Sizes uint64 // in 512-byte sectors (the disk's logical blocks)
	// GUID is the partition's unique GUID in its on-disk byte order (as
	// platform/gpt keeps it).
	GUID [16]byte
}

// BootPath is the device path of file (e.g. `\EFI\plinth\b.efi`) on
// partition hd: what the firmware needs to find the file on whatever
// controller the disk is (it matches the partition by its GUID).
func BootPath(hd HardDrive, file string) []byte {
	b := []byte{mediaType, hardDriveSub}
	b = binary.LittleEndian.AppendUint16(b, hardDriveLength)
	b = binary.LittleEndian.AppendUint32(b, hd.Number)
	b = binary.LittleEndian.AppendUint64(b, hd.StartLBA)
	b = binary.LittleEndian.AppendUint64(b, hd.Sizes)
	b = append(b, hd.GUID[:]...)
	b = append(b, gptFormat, guidSignature)
	name := utf16z(strings.ReplaceAll(file, "/", `\`))
	b = append(b, mediaType, filePathSub)
	b = binary.LittleEndian.AppendUint16(b, uint16(4+len(name)))
	b = append(b, name...)
	return append(b, endType, endEntireSub, 4, 0)
}

// ParseBootPath returns the partition and file of a device path that
// BootPath could have made (nodes before the HD node, such as the PCI
// path firmware adds for its own entries, are skipped); ok is false for
// any other path.
func ParseBootPath(p []byte) (hd HardDrive, file string, ok bool) {
	var haveHD bool
	for len(p) >= 4 {
		typ, sub, n := p[0], p[1], int(binary.LittleEndian.Uint16(p[2:]))
		if n < 4 || n > len(p) {
			return hd, "", false
		}
		node := p[4:n]
		switch {
		case typ == mediaType && sub == hardDriveSub && n == hardDriveLength:
			hd.Number = binary.LittleEndian.Uint32(node)
			hd.StartLBA = binary.LittleEndian.Uint64(node[4:])
			hd.Sizes = binary.LittleEndian.Uint64(node[12:])
			copy(hd.GUID[:], node[20:36])
			haveHD = node[36] == gptFormat && node[37] == guidSignature
		case typ == mediaType && sub == filePathSub:
			s, _, err := readUTF16z(node)
			if err != nil {
				return hd, "", false
			}
			file = s
		case typ == endType && sub == endEntireSub:
			return hd, file, haveHD && file != ""
		}
		p = p[n:]
	}
	return hd, "", false
}

func bootName(n uint16) string { return fmt.Sprintf("Boot%04X", n) }

// BootEntries returns every Boot#### entry by number.
func (s Store) BootEntries() (map[uint16]LoadOption, error) {
	ents, err := os.ReadDir(s.Dir)
	if err != nil {
		return nil, err
	}
	out := map[uint16]LoadOption{}
	for _, e := range ents {
		name, guid, ok := strings.Cut(e.Name(), "-")
		if !ok || !strings.EqualFold(guid, GlobalGUID) || len(name) != 8 || !strings.HasPrefix(name, "Boot") {
			continue
		}
		n, err := strconv.ParseUint(name[4:], 16, 16)
		if err != nil {
			continue // BootNext, BootOrder…
		}
		_, data, err := s.Read(name, GlobalGUID)
		if err != nil {
			return nil, err
		}
		o, err := ParseLoadOption(data)
		if err != nil {
			return nil, fmt.Errorf("%s: %w", name, err)
		}
		out[uint16(n)] = o
	}
	return out, nil
}

// SetBootEntry writes entry n.
func (s Store) SetBootEntry(n uint16, o LoadOption) error {
	return s.Write(bootName(n), GlobalGUID, BootVarAttributes, o.Marshal())
}

// FreeBootNumber returns the lowest entry number not in use.
func FreeBootNumber(entries map[uint16]LoadOption) (uint16, error) {
	for n := 0; n <= 0xffff; n++ {
		if _, used := entries[uint16(n)]; !used {
			return uint16(n), nil
		}
	}
	return 0, errors.New("efivar: every boot entry number is in use")
}

func (s Store) readU16s(name string) ([]uint16, error) {
	_, b, err := s.Read(name, GlobalGUID)
	if err != nil {
		return nil, err
	}
	if len(b)%2 != 0 {
		return nil, fmt.Errorf("efivar: %s has %d bytes, not a list of 16-bit numbers", name, len(b))
	}
	out := make([]uint16, len(b)/2)
	for i := range out {
		out[i] = binary.LittleEndian.Uint16(b[2*i:])
	}
	return out, nil
}

func (s Store) writeU16s(name string, v []uint16) error {
	b := make([]byte, 0, 2*len(v))
	for _, x := range v {
		b = binary.LittleEndian.AppendUint16(b, x)
	}
	return s.Write(name, GlobalGUID, BootVarAttributes, b)
}

// BootOrder returns the firmware's boot order (ErrNotFound if unset).
func (s Store) BootOrder() ([]uint16, error) { return s.readU16s("BootOrder") }

// SetBootOrder sets it.
func (s Store) SetBootOrder(order []uint16) error { return s.writeU16s("BootOrder", order) }

// BootNext returns the entry the next boot takes once (ErrNotFound if
// none).
func (s Store) BootNext() (uint16, error) { return s.readU16("BootNext") }

// SetBootNext makes the next boot, and only that one, take entry n.
func (s Store) SetBootNext(n uint16) error { return s.writeU16s("BootNext", []uint16{n}) }

// ClearBootNext deletes BootNext.
func (s Store) ClearBootNext() error { return s.Delete("BootNext", GlobalGUID) }

// BootCurrent returns the entry this boot came from.
func (s Store) BootCurrent() (uint16, error) { return s.readU16("BootCurrent") }

func (s Store) readU16(name string) (uint16, error) {
	v, err := s.readU16s(name)
	if err != nil {
		return 0, err
	}
	if len(v) != 1 {
		return 0, fmt.Errorf("efivar: %s has %d values, want 1", name, len(v))
	}
	return v[0], nil
}

// SortedNumbers returns the entry numbers in ascending order.
func SortedNumbers(entries map[uint16]LoadOption) []uint16 {
	out := make([]uint16, 0, len(entries))
	for n := range entries {
		out = append(out, n)
	}
	sort.Slice(out, func(i, j int) bool { return out[i] < out[j] })
	return out
}
