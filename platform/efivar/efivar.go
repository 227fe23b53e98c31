// Package efivar reads and writes UEFI variables through efivarfs and
// encodes the firmware's boot entries (Boot####, BootOrder, BootNext),
// which an A/B update uses to boot the new slot's UKI once.
//
//	/sys/firmware/efi/efivars/Boot0003-8be4df61-93ca-11d2-aa0d-00e098032b8c
//	  ├─ attributes (u32 LE)  non-volatile | boot service | runtime access
//	  └─ EFI_LOAD_OPTION      attributes, description (UTF-16),
//	                          device path: HD(partition, GPT GUID) / File(\EFI\plinth\b.efi) / End,
//	                          optional data (none: see below)
//	BootNext    u16: the entry the firmware boots once, then deletes
//	BootOrder   []u16: the entries it tries on every other boot
//	BootCurrent u16: the entry this boot came from (firmware sets it)
//
// Why its own package: the encoding is small, fixed by the UEFI
// specification (3.1.3 Load Options, 10.3 Device Path Nodes), and the
// node needs no C library (efibootmgr) for it. Plinth's entries carry no
// optional data: systemd-stub would take it as the kernel command line
// (and measure it into PCR 12, which the node seals to).
package efivar

import (
	"encoding/binary"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"unicode/utf16"

	"golang.org/x/sys/unix"
)

// Dir is where efivarfs is mounted.
const Dir = "/sys/firmware/efi/efivars"

// GlobalGUID is EFI_GLOBAL_VARIABLE, the vendor of the Boot* variables.
const GlobalGUID = "8be4df61-93ca-11d2-aa0d-00e098032b8c"

// Variable attributes.
const (
	NonVolatile       uint32 = 0x1
	BootServiceAccess uint32 = 0x2
	RuntimeAccess     uint32 = 0x4
	// BootVarAttributes are those of Boot####, BootOrder and BootNext.
	BootVarAttributes = NonVolatile | BootServiceAccess | RuntimeAccess
)

// fsImmutableFL is FS_IMMUTABLE_FL of linux/fs.h (x/sys has no name for
// it).
const fsImmutableFL = 0x00000010

// ErrNotFound: the variable does not exist.
var ErrNotFound = errors.New("efivar: variable not found")

// Store is an efivarfs directory (Dir on a node; tests use a temporary
// directory).
type Store struct{ Dir string }

func (s Store) path(name, guid string) string {
	return filepath.Join(s.Dir, name+"-"+strings.ToLower(guid))
}

// Read returns a variable's attributes and data.
func (s Store) Read(name, guid string) (uint32, []byte, error) {
	b, err := os.ReadFile(s.path(name, guid))
	if errors.Is(err, fs.ErrNotExist) {
		return 0, nil, fmt.Errorf("%w: %s", ErrNotFound, name)
	}
	if err != nil {
		return 0, nil, err
	}
	if len(b) < 4 {
		return 0, nil, fmt.Errorf("efivar: %s: %d bytes, no attributes", name, len(b))
	}
	return binary.LittleEndian.Uint32(b), b[4:], nil
}

// Write sets a variable (creating it), in one write as efivarfs needs.
// efivarfs makes most variables' files immutable; the flag is cleared
// first, as efibootmgr does.
func (s Store) Write(name, guid string, attrs uint32, data []byte) error {
	p := s.path(name, guid)
	if err := setImmutable(p, false); err != nil {
		return err
	}
	buf := binary.LittleEndian.AppendUint32(make([]byte, 0, 4+len(data)), attrs)
	buf = append(buf, data...)
	f, err := os.OpenFile(p, os.O_WRONLY|os.O_CREATE, 0o644)
	if err != nil {
		return fmt.Errorf("efivar: %s: %w", name, err)
	}
	// efivarfs replaces a variable with each write (and cannot truncate);
	// a plain directory (tests) must be truncated.
	var fs unix.Statfs_t
	if err := unix.Fstatfs(int(f.Fd()), &fs); err == nil && fs.Type != unix.EFIVARFS_MAGIC {
		if err := f.Truncate(0); err != nil {
			f.Close()
			return err
		}
	}
	if _, err := f.Write(buf); err != nil {
		f.Close()
		return fmt.Errorf("efivar: writing %s: %w", name, err)
	}
	return f.Close()
}

// Delete removes a variable; a missing one is no error.
func (s Store) Delete(name, guid string) error {
	p := s.path(name, guid)
	if err := setImmutable(p, false); err != nil {
		return err
	}
	if err := os.Remove(p); err != nil && !errors.Is(err, fs.ErrNotExist) {
		return fmt.Errorf("efivar: deleting %s: %w", name, err)
	}
	return nil
}

// setImmutable sets or clears FS_IMMUTABLE_FL on p. A missing file or a
// file system without flags (tests) is no error.
func setImmutable(p string, on bool) error {
	f, err := os.Open(p)
	if errors.Is(err, fs.ErrNotExist) {
		return nil
	}
	if err != nil {
		return err
	}
	defer f.Close()
	flags, err := unix.IoctlGetUint32(int(f.Fd()), unix.FS_IOC_GETFLAGS)
	if errors.Is(err, unix.ENOTTY) || errors.Is(err, unix.EOPNOTSUPP) || errors.Is(err, unix.EINVAL) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("efivar: flags of %s: %w", filepath.Base(p), err)
	}
	next := flags &^ fsImmutableFL
	if on {
		next = flags | fsImmutableFL
	}
	if next == flags {
		return nil
	}
	if err := unix.IoctlSetPointerInt(int(f.Fd()), unix.FS_IOC_SETFLAGS, int(next)); err != nil {
		return fmt.Errorf("efivar: flags of %s: %w", filepath.Base(p), err)
	}
	return nil
}

// utf16z encodes s as UTF-16LE with a terminating zero.
func utf16z(s string) []byte {
	u := utf16.Encode([]rune(s))
	b := make([]byte, 0, 2*len(u)+2)
	for _, c := range u {
		b = binary.LittleEndian.AppendUint16(b, c)
	}
	return append(b, 0, 0)
}

// readUTF16z decodes a zero-terminated UTF-16LE string at the start of b
// and returns it with the number of bytes it took (terminator included).
func readUTF16z(b []byte) (string, int, error) {
	var u []uint16
	for i := 0; i+1 < len(b); i += 2 {
		c := binary.LittleEndian.Uint16(b[i:])
		if c == 0 {
			return string(utf16.Decode(u)), i + 2, nil
		}
		u = append(u, c)
	}
	return "", 0, errors.New("efivar: unterminated UTF-16 string")
}
