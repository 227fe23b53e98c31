// Package bootdisk finds the flashed disk a node booted from: its EFI
// system partition (ESP, where the node parameters may be) and its system
// slots (where a disk boot's system image is).
//
//	firmware ─► ESP/EFI/BOOT/BOOTX64.EFI (UKI) ─► systemd-stub sets the EFI variable
//	            LoaderDevicePartUUID = the ESP's partition GUID
//	/init: efivarfs ─► that GUID ─► the disk whose GPT has it ─► ESP, slot a, slot b
//
// Why the ESP's GUID and not a GUID on the command line: the UKI of a slot
// must boot on every disk it is written to (an update writes the same UKI
// into slot b of every node), so it cannot name one disk's partitions.
// Booted by something that sets no LoaderDevicePartUUID, the node takes
// the only disk that has the slot, and refuses to guess between two.
//
// Nothing here writes to a disk. A slot found on the wrong disk would
// still be checked block by block by dm-verity against the root hash on
// the measured command line.
package bootdisk

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"time"
	"unicode/utf16"

	"golang.org/x/sys/unix"

	"plinth.dev/plinth/platform/blockdev"
	"plinth.dev/plinth/platform/gpt"
	"plinth.dev/plinth/platform/layout"
)

// EFIVarsDir is where efivarfs is mounted.
const EFIVarsDir = "/sys/firmware/efi/efivars"

// loaderGUID is the vendor GUID of systemd-boot's and systemd-stub's
// variables (the Boot Loader Interface).
const loaderGUID = "4a67b082-0a4c-41cf-b6c7-440b29bb8c4f"

// ErrNotFound: no disk holds what was asked for.
var ErrNotFound = errors.New("bootdisk: not found")

// UEFI reports whether the kernel was started by UEFI firmware.
func UEFI() bool {
	_, err := os.Stat("/sys/firmware/efi")
	return err == nil
}

// MountEFIVars mounts efivarfs (module efivarfs) at EFIVarsDir, if the
// machine booted through UEFI and it is not mounted yet.
func MountEFIVars() error {
	if !UEFI() {
		return nil
	}
	if _, err := os.Stat(filepath.Join(EFIVarsDir, "LoaderDevicePartUUID-"+loaderGUID)); err == nil {
		return nil
	}
	err := unix.Mount("efivarfs", EFIVarsDir, "efivarfs", unix.MS_NOSUID|unix.MS_NODEV|unix.MS_NOEXEC, "")
	if err != nil && !errors.Is(err, unix.EBUSY) {
		return fmt.Errorf("mounting efivarfs: %w", err)
	}
	return nil
}

// LoaderDevicePartUUID returns the partition GUID of the ESP the UKI was
// loaded from, as systemd-stub exported it; "" if it did not (another
// loader, a network boot, or no UEFI).
func LoaderDevicePartUUID(efivars string) (string, error) {
	return LoaderVar(efivars, "LoaderDevicePartUUID")
}

// LoaderVar returns the Boot Loader Interface string variable name
// (LoaderDevicePartUUID, StubPcrKernelImage, ...), "" if it is not set.
func LoaderVar(efivars, name string) (string, error) {
	b, err := os.ReadFile(filepath.Join(efivars, name+"-"+loaderGUID))
	if errors.Is(err, os.ErrNotExist) {
		return "", nil
	}
	if err != nil {
		return "", err
	}
	return decodeVarString(b)
}

// decodeVarString decodes an efivarfs file holding a UTF-16LE string: 4
// bytes of attributes, then the string, NUL-terminated or not.
func decodeVarString(b []byte) (string, error) {
	if len(b) < 4 || (len(b)-4)%2 != 0 {
		return "", fmt.Errorf("bootdisk: malformed EFI string variable (%d bytes)", len(b))
	}
	u := make([]uint16, 0, (len(b)-4)/2)
	for i := 4; i+1 < len(b); i += 2 {
		c := uint16(b[i]) | uint16(b[i+1])<<8
		if c == 0 {
			break
		}
		u = append(u, c)
	}
	return strings.TrimSpace(string(utf16.Decode(u))), nil
}

// Disk is one disk with its partition table.
type Disk struct {
	Path  string // "/dev/vda"
	Table *gpt.Table
}

// Boot is the flashed disk the node booted from.
type Boot struct {
	Disk  string
	Table *gpt.Table
	ESP   gpt.Partition
}

// ESPDevice is the ESP's device node.
func (b *Boot) ESPDevice() string { return blockdev.PartitionPath(b.Disk, b.ESP.Number) }

// Slot returns the device node and entry of system slot s ("a", "b").
func (b *Boot) Slot(s string) (string, gpt.Partition, error) {
	p, ok := findSlot(b.Table, s)
	if !ok {
		return "", gpt.Partition{}, fmt.Errorf("%w: %s has no system slot %q", ErrNotFound, b.Disk, s)
	}
	return blockdev.PartitionPath(b.Disk, p.Number), p, nil
}

var (
	espType  = gpt.MustParseGUID(layout.ESPType)
	slotType = gpt.MustParseGUID(layout.SystemSlotType)
)

func findSlot(t *gpt.Table, s string) (gpt.Partition, bool) {
	for _, p := range t.FindAll(slotType) {
		if p.Name == layout.SystemSlotNamePrefix+s {
			return p, true
		}
	}
	return gpt.Partition{}, false
}

// Choose picks the boot disk among disks: the one whose ESP has the
// partition GUID espUUID, or, when espUUID is "", the only disk that has
// an ESP and system slot slot. Anything else is an error naming the disks.
func Choose(disks []Disk, espUUID, slot string) (*Boot, error) {
	var found []*Boot
	for _, d := range disks {
		if d.Table == nil {
			continue
		}
		for _, p := range d.Table.FindAll(espType) {
			if espUUID != "" && !strings.EqualFold(p.ID.String(), espUUID) {
				continue
			}
			if _, ok := findSlot(d.Table, slot); espUUID == "" && !ok {
				continue
			}
			found = append(found, &Boot{Disk: d.Path, Table: d.Table, ESP: p})
		}
	}
	switch {
	case len(found) == 1:
		return found[0], nil
	case len(found) > 1:
		var names []string
		for _, b := range found {
			names = append(names, b.Disk)
		}
		return nil, fmt.Errorf("bootdisk: %d disks could be the boot disk (%s) and the firmware did not say which: boot through the UKI, or keep one flashed disk", len(found), strings.Join(names, ", "))
	case espUUID != "":
		return nil, fmt.Errorf("%w: no disk has the ESP %s the UKI was loaded from", ErrNotFound, espUUID)
	}
	return nil, fmt.Errorf("%w: no disk has an ESP and system slot %q", ErrNotFound, slot)
}

// Scan reads the partition table of every disk, removable ones included.
// A disk without a readable table is listed with a nil Table.
func Scan() ([]Disk, error) {
	ds, err := blockdev.AllDisks()
	if err != nil {
		return nil, err
	}
	out := make([]Disk, 0, len(ds))
	for _, d := range ds {
		var t *gpt.Table
		if f, err := os.Open(d.Path); err == nil {
			t, _ = gpt.Read(f, d.Size)
			f.Close()
		}
		out = append(out, Disk{Path: d.Path, Table: t})
	}
	return out, nil
}

// Find waits up to timeout for the boot disk to appear (drivers probe
// after their module loaded) and returns it.
func Find(ctx context.Context, espUUID, slot string, timeout time.Duration) (*Boot, error) {
	deadline := time.Now().Add(timeout)
	for {
		disks, err := Scan()
		if err != nil {
			return nil, err
		}
		b, err := Choose(disks, espUUID, slot)
		if err == nil || !errors.Is(err, ErrNotFound) || time.Now().After(deadline) {
			return b, err
		}
		select {
		case <-ctx.Done():
			return nil, ctx.Err()
		case <-time.After(50 * time.Millisecond):
		}
	}
}
