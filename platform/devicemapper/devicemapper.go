// Package devicemapper drives the kernel's device-mapper through ioctls on
// /dev/mapper/control, the way dmsetup does, without any userspace tools or
// udev: it creates the /dev/mapper/NAME node itself.
//
//	Create(name) ──► LoadTable(name, targets) ──► Resume(name) ──► /dev/mapper/NAME live
//	                                            Suspend / Status / Remove
package devicemapper

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"unsafe"

	"golang.org/x/sys/unix"
)

// ControlPath is the device-mapper control node (misc char 10:236).
const ControlPath = "/dev/mapper/control"

const (
	ioctlStructSize = 312 // sizeof(struct dm_ioctl)
	targetSpecSize  = 40  // sizeof(struct dm_target_spec)
	nameLen         = 128
	uuidLen         = 129

	cmdVersion     = 0
	cmdDevCreate   = 3
	cmdDevRemove   = 4
	cmdDevSuspend  = 6
	cmdDevStatus   = 7
	cmdTableLoad   = 9
	cmdTableStatus = 12

	flagReadOnly    = 1 << 0
	flagSuspend     = 1 << 1
	flagStatusTable = 1 << 4
	flagBufferFull  = 1 << 8
)

// ioctl number: _IOWR(0xfd, cmd, struct dm_ioctl).
func ioctlNumber(cmd uint) uint {
	return 3<<30 | ioctlStructSize<<16 | 0xfd<<8 | cmd
}

// Target is one line of a device-mapper table.
type Target struct {
	Start  uint64 // sectors
	Length uint64 // sectors
	Type   string // "verity", "crypt", "integrity", "linear", ...
	Params string
}

// ParseTable parses table lines in dmsetup syntax "START LENGTH TYPE PARAMS".
func ParseTable(table string) ([]Target, error) {
	var ts []Target
	for _, line := range strings.Split(strings.TrimSpace(table), "\n") {
		var t Target
		f := strings.SplitN(strings.TrimSpace(line), " ", 4)
		if len(f) < 3 {
			return nil, fmt.Errorf("devicemapper: table line %q: want START LENGTH TYPE [PARAMS]", line)
		}
		if _, err := fmt.Sscan(f[0]+" "+f[1], &t.Start, &t.Length); err != nil {
			return nil, fmt.Errorf("devicemapper: table line %q: %w", line, err)
		}
		t.Type = f[2]
		if len(f) == 4 {
			t.Params = f[3]
		}
		ts = append(ts, t)
	}
	return ts, nil
}

// Device is the state of one mapped device.
type Device struct {
	Name      string
	Major     uint32
	Minor     uint32
	OpenCount int32
	Suspended bool
	ReadOnly  bool
	Targets   int
}

// Path is the device node of the mapped device.
func (d Device) Path() string { return "/dev/mapper/" + d.Name }

func validName(name string) error {
	if name == "" || len(name) >= nameLen || strings.ContainsAny(name, "/\x00") {
		return fmt.Errorf("devicemapper: invalid device name %q", name)
	}
	return nil
}

// request builds a dm_ioctl header followed by payload.
func request(name string, flags uint32, payload []byte, targets int) []byte {
	// Room for the kernel's answer (status strings) beyond what we send.
	size := ioctlStructSize + len(payload)
	if size < 16384 {
		size = 16384
	}
	b := make([]byte, size)
	le := binary.LittleEndian
	le.PutUint32(b[0:], 4) // interface version 4.0.0
	le.PutUint32(b[12:], uint32(size))
	le.PutUint32(b[16:], ioctlStructSize)
	le.PutUint32(b[20:], uint32(targets))
	le.PutUint32(b[28:], flags)
	copy(b[48:48+nameLen], name)
	copy(b[ioctlStructSize:], payload)
	return b
}

func call(cmd uint, buf []byte) error {
	f, err := os.OpenFile(ControlPath, os.O_RDWR, 0)
	if err != nil {
		if errors.Is(err, os.ErrNotExist) {
			err = fmt.Errorf("%s missing (is dm_mod loaded?): %w", ControlPath, err)
		}
		return err
	}
	defer f.Close()
	_, _, errno := unix.Syscall(unix.SYS_IOCTL, f.Fd(), uintptr(ioctlNumber(cmd)), uintptr(unsafe.Pointer(&buf[0])))
	if errno != 0 {
		return errno
	}
	return nil
}

func parseDevice(name string, b []byte) Device {
	le := binary.LittleEndian
	flags := le.Uint32(b[28:])
	dev := le.Uint64(b[40:])
	return Device{
		Name:      name,
		Major:     unix.Major(dev),
		Minor:     unix.Minor(dev),
		OpenCount: int32(le.Uint32(b[24:])),
		Targets:   int(le.Uint32(b[20:])),
		Suspended: flags&flagSuspend != 0,
		ReadOnly:  flags&flagReadOnly != 0,
	}
}

// Version returns the kernel's device-mapper interface version.
func Version() (string, error) {
	b := request("", 0, nil, 0)
	if err := call(cmdVersion, b); err != nil {
		return "", fmt.Errorf("devicemapper: version: %w", err)
	}
	le := binary.LittleEndian
	return fmt.Sprintf("%d.%d.%d", le.Uint32(b[0:]), le.Uint32(b[4:]), le.Uint32(b[8:])), nil
}

// Create makes a new, empty (and suspended) mapped device and its node.
func Create(name string) (Device, error) {
	if err := validName(name); err != nil {
		return Device{}, err
	}
	b := request(name, 0, nil, 0)
	if err := call(cmdDevCreate, b); err != nil {
		return Device{}, fmt.Errorf("devicemapper: create %s: %w", name, err)
	}
	d := parseDevice(name, b)
	return d, makeNode(d)
}

// makeNode creates /dev/mapper/NAME: with no udev nobody else will.
func makeNode(d Device) error {
	p := d.Path()
	if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
		return err
	}
	os.Remove(p)
	if err := unix.Mknod(p, unix.S_IFBLK|0o600, int(unix.Mkdev(d.Major, d.Minor))); err != nil {
		return fmt.Errorf("devicemapper: mknod %s: %w", p, err)
	}
	return nil
}

// LoadTable loads targets as the inactive table of name; Resume activates it.
func LoadTable(name string, targets []Target, readOnly bool) error {
	if err := validName(name); err != nil {
		return err
	}
	var payload bytes.Buffer
	for _, t := range targets {
		params := append([]byte(t.Params), 0)
		// Each spec is followed by its NUL-terminated parameters, and the
		// next spec starts 8-byte aligned.
		next := (targetSpecSize + len(params) + 7) &^ 7
		spec := make([]byte, next)
		le := binary.LittleEndian
		le.PutUint64(spec[0:], t.Start)
		le.PutUint64(spec[8:], t.Length)
		le.PutUint32(spec[20:], uint32(next))
		if len(t.Type) >= 16 {
			return fmt.Errorf("devicemapper: target type %q too long", t.Type)
		}
		copy(spec[24:40], t.Type)
		copy(spec[targetSpecSize:], params)
		payload.Write(spec)
	}
	var flags uint32
	if readOnly {
		flags |= flagReadOnly
	}
	if err := call(cmdTableLoad, request(name, flags, payload.Bytes(), len(targets))); err != nil {
		return fmt.Errorf("devicemapper: load table of %s: %w", name, err)
	}
	return nil
}

// Resume activates the loaded table (or resumes I/O after Suspend).
func Resume(name string) error {
	if err := call(cmdDevSuspend, request(name, 0, nil, 0)); err != nil {
		return fmt.Errorf("devicemapper: resume %s: %w", name, err)
	}
	return nil
}

// Suspend stops I/O to name, flushing what is in flight.
func Suspend(name string) error {
	if err := call(cmdDevSuspend, request(name, flagSuspend, nil, 0)); err != nil {
		return fmt.Errorf("devicemapper: suspend %s: %w", name, err)
	}
	return nil
}

// Remove deletes the mapped device and its node.
func Remove(name string) error {
	if err := validName(name); err != nil {
		return err
	}
	if err := call(cmdDevRemove, request(name, 0, nil, 0)); err != nil {
		return fmt.Errorf("devicemapper: remove %s: %w", name, err)
	}
	os.Remove("/dev/mapper/" + name)
	return nil
}

// Info returns the state of name.
func Info(name string) (Device, error) {
	b := request(name, 0, nil, 0)
	if err := call(cmdDevStatus, b); err != nil {
		return Device{}, fmt.Errorf("devicemapper: status of %s: %w", name, err)
	}
	return parseDevice(name, b), nil
}

// Status returns each target's status line (TABLE_STATUS), e.g. "V" for a
// verity target whose data verified so far, "C" once corruption was seen.
// With table set it returns the table lines instead.
func Status(name string, table bool) ([]Target, error) {
	var flags uint32
	if table {
		flags = flagStatusTable
	}
	b := request(name, flags, nil, 0)
	if err := call(cmdTableStatus, b); err != nil {
		return nil, fmt.Errorf("devicemapper: table status of %s: %w", name, err)
	}
	le := binary.LittleEndian
	if le.Uint32(b[28:])&flagBufferFull != 0 {
		return nil, fmt.Errorf("devicemapper: status of %s does not fit the buffer", name)
	}
	n := int(le.Uint32(b[20:]))
	pos := int(le.Uint32(b[16:]))
	var out []Target
	for i := 0; i < n; i++ {
		spec := b[pos:]
		t := Target{
			Start:  le.Uint64(spec[0:]),
			Length: le.Uint64(spec[8:]),
			Type:   strings.TrimRight(string(spec[24:40]), "\x00"),
		}
		params := spec[targetSpecSize:]
		if j := bytes.IndexByte(params, 0); j >= 0 {
			params = params[:j]
		}
		t.Params = string(params)
		out = append(out, t)
		// For answers, next is the offset from the start of the data area.
		pos = int(le.Uint32(b[16:])) + int(le.Uint32(spec[20:]))
	}
	return out, nil
}
