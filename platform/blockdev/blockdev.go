// Package blockdev finds and inspects block devices through sysfs and
// ioctls, without udev.
package blockdev

import (
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"
)

// Disk is a whole disk.
type Disk struct {
	Name string // "vda"
	Path string // "/dev/vda"
	Size int64
	// Serial is the serial number the kernel reports (/sys/block/NAME/serial,
	// or device/serial for NVMe), "" if none.
	Serial string
}

// skipPrefixes are virtual or removable devices that never hold node data.
var skipPrefixes = []string{"loop", "dm-", "ram", "zram", "sr", "md", "nbd"}

// Disks lists whole disks (not partitions, loop, device-mapper or optical
// devices), sorted by name. Removable disks are left out: they never hold
// node data.
func Disks() ([]Disk, error) { return disks(false) }

// AllDisks is Disks with removable disks (a USB stick a node boots from).
func AllDisks() ([]Disk, error) { return disks(true) }

func disks(removable bool) ([]Disk, error) {
	entries, err := os.ReadDir("/sys/block")
	if err != nil {
		return nil, err
	}
	var out []Disk
next:
	for _, e := range entries {
		name := e.Name()
		for _, p := range skipPrefixes {
			if strings.HasPrefix(name, p) {
				continue next
			}
		}
		if b, err := os.ReadFile(filepath.Join("/sys/block", name, "removable")); !removable && err == nil && strings.TrimSpace(string(b)) == "1" {
			continue
		}
		b, err := os.ReadFile(filepath.Join("/sys/block", name, "size"))
		if err != nil {
			continue
		}
		sectors, _ := strconv.ParseInt(strings.TrimSpace(string(b)), 10, 64)
		if sectors == 0 {
			continue
		}
		out = append(out, Disk{Name: name, Path: "/dev/" + name, Size: sectors * 512, Serial: serial(name)})
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Name < out[j].Name })
	return out, nil
}

// serial reads a disk's serial number: virtio-blk lists it on the disk,
// NVMe on its controller (device/serial).
func serial(name string) string {
	for _, f := range []string{"serial", "device/serial"} {
		if b, err := os.ReadFile(filepath.Join("/sys/block", name, f)); err == nil {
			if s := strings.TrimSpace(string(b)); s != "" {
				return s
			}
		}
	}
	return ""
}

// PartitionPath returns the device node of partition number n (1-based) of
// disk: vda → vda1, nvme0n1 → nvme0n1p1.
func PartitionPath(disk string, n int) string {
	if last := disk[len(disk)-1]; last >= '0' && last <= '9' {
		return fmt.Sprintf("%sp%d", disk, n)
	}
	return fmt.Sprintf("%s%d", disk, n)
}

// RereadPartitions asks the kernel to re-read disk's partition table and
// waits until the node of partition n (1-based) exists.
func RereadPartitions(disk string, n int) error {
	f, err := os.OpenFile(disk, os.O_RDONLY, 0)
	if err != nil {
		return err
	}
	err = unix.IoctlSetInt(int(f.Fd()), unix.BLKRRPART, 0)
	f.Close()
	if err != nil {
		return fmt.Errorf("re-reading partition table of %s: %w", disk, err)
	}
	p := PartitionPath(disk, n)
	for i := 0; i < 100; i++ {
		if _, err := os.Stat(p); err == nil {
			return nil
		}
		time.Sleep(20 * time.Millisecond)
	}
	return fmt.Errorf("%s did not appear after re-reading the partition table", p)
}

// AddPartition tells the kernel about partition n of disk (start and
// length in bytes) alone, with BLKPG, and waits for its device node. Unlike
// RereadPartitions it works while other partitions of the disk are in use
// (a flashed disk's system slot is mounted when its data partition is
// added).
func AddPartition(disk string, n int, start, length int64) error {
	f, err := os.OpenFile(disk, os.O_RDONLY, 0)
	if err != nil {
		return err
	}
	part := unix.BlkpgPartition{Start: start, Length: length, Pno: int32(n)}
	arg := unix.BlkpgIoctlArg{Op: unix.BLKPG_ADD_PARTITION, Datalen: int32(unsafe.Sizeof(part)), Data: (*byte)(unsafe.Pointer(&part))}
	_, _, errno := unix.Syscall(unix.SYS_IOCTL, f.Fd(), unix.BLKPG, uintptr(unsafe.Pointer(&arg)))
	f.Close()
	if errno != 0 {
		return fmt.Errorf("adding partition %d of %s to the kernel: %w", n, disk, errno)
	}
	p := PartitionPath(disk, n)
	for i := 0; i < 100; i++ {
		if _, err := os.Stat(p); err == nil {
			return nil
		}
		time.Sleep(20 * time.Millisecond)
	}
	return fmt.Errorf("%s did not appear after adding it", p)
}

// Size returns the size in bytes of a block device.
func Size(dev string) (int64, error) {
	f, err := os.Open(dev)
	if err != nil {
		return 0, err
	}
	defer f.Close()
	return f.Seek(0, 2)
}

// MajorMinor returns "MAJ:MIN" of a device node, as device-mapper tables
// want it.
func MajorMinor(dev string) (string, error) {
	var st unix.Stat_t
	if err := unix.Stat(dev, &st); err != nil {
		return "", err
	}
	return fmt.Sprintf("%d:%d", unix.Major(st.Rdev), unix.Minor(st.Rdev)), nil
}
