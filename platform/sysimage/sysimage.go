// Package sysimage opens the read-only system image carried in the
// initramfs (or, in a disk boot, on a system slot partition): it attaches
// a file to a loop device, puts a dm-verity target on it (or on the
// partition) whose root hash came from the (measured) kernel command line, and
// mounts it read-only at once. Verify then reads the whole device once, in
// the background and at low priority.
//
//	/system.img ──► /dev/loopN ──┐
//	slot partition /dev/vda2 ────┴► dm-verity "system" ──► mount squashfs ro ──► boot goes on
//	                                       └──────────► Verify: every block, paced (background)
//
// Why mount before the full read: dm-verity checks every block against the
// hash tree when it is read, so tampered data never reaches a process
// whether or not the full read has happened; the full read only makes sure
// a tampered block is found even if nothing would read it for a long time.
// It costs ~0.1 s per MiB under TCG, and with Kubernetes the image is tens
// of MiB, which the boot should not wait for. The caller halts the node
// when Verify fails (init/core.go).
package sysimage

import (
	"errors"
	"fmt"
	"os"
	"time"

	"golang.org/x/sys/unix"

	"plinth.dev/plinth/platform/blockdev"
	"plinth.dev/plinth/platform/devicemapper"
	"plinth.dev/plinth/platform/loop"
	"plinth.dev/plinth/platform/verity"
)

// DeviceName is the device-mapper name of the verified system image.
const DeviceName = "system"

// ErrTampered means the image does not match its root hash.
var ErrTampered = errors.New("system image does not match the root hash on the kernel command line (tampered or corrupt)")

// Result describes an opened image.
type Result struct {
	Loop   string
	Device string
	// Size is the verity device's size: the data the root hash covers.
	Size int64
	name string
}

// Open maps file through dm-verity as DeviceName. Nothing is read yet:
// every read through Device is checked, and Verify checks every block.
func Open(file string, p verity.Params) (*Result, error) { return OpenNamed(DeviceName, file, p) }

// OpenNamed is Open with another device-mapper name (an update checks the
// slot it wrote while the running image stays mapped); Close removes it.
func OpenNamed(name, file string, p verity.Params) (*Result, error) {
	r := &Result{Size: int64(p.DataBlocks) * verity.BlockSize}
	st, err := os.Stat(file)
	if err != nil {
		return nil, err
	}
	if st.Mode()&os.ModeDevice != 0 {
		// A system slot partition (disk boot): no loop device needed.
		r.Loop = file
	} else if r.Loop, err = loop.Attach(file, true); err != nil {
		return nil, err
	}
	dev, err := blockdev.MajorMinor(r.Loop)
	if err != nil {
		return nil, err
	}
	if size, err := blockdev.Size(r.Loop); err != nil {
		return nil, err
	} else if need := int64(p.HashStartBlock+p.HashBlocks()) * verity.BlockSize; size < need {
		return nil, fmt.Errorf("%w: %s holds %d bytes, the verity parameters need %d", ErrTampered, r.Loop, size, need)
	}
	targets, err := devicemapper.ParseTable(p.Table(dev))
	if err != nil {
		return nil, err
	}
	d, err := devicemapper.Create(name)
	if err != nil {
		return nil, err
	}
	r.Device, r.name = d.Path(), name
	if err := devicemapper.LoadTable(name, targets, true); err != nil {
		devicemapper.Remove(name)
		return nil, err
	}
	if err := devicemapper.Resume(name); err != nil {
		devicemapper.Remove(name)
		return nil, err
	}
	return r, nil
}

// Close removes the verity device (of an image opened from a partition:
// a loop device stays attached).
func (r *Result) Close() error { return devicemapper.Remove(r.name) }

// Mount mounts the verity device read-only at target.
func Mount(dev, target, fstype string) error {
	if err := os.MkdirAll(target, 0o755); err != nil {
		return err
	}
	if err := unix.Mount(dev, target, fstype, unix.MS_RDONLY|unix.MS_NODEV, ""); err != nil {
		return fmt.Errorf("mounting system image %s (%s) at %s: %w", dev, fstype, target, err)
	}
	return nil
}

// Status returns the kernel's verity status of the device: "V" verified
// so far, "C" a corrupt block was seen.
func Status() string {
	ts, err := devicemapper.Status(DeviceName, false)
	if err != nil || len(ts) != 1 {
		return "?"
	}
	return ts[0].Params
}

// Verification is the outcome of a full read.
type Verification struct {
	Bytes    int64         // read through verity
	Took     time.Duration // wall time, pauses included
	Busy     time.Duration // time spent in reads
	Status   string        // the kernel's verity status afterwards
	Direct   bool          // read with O_DIRECT (no second copy in the page cache)
	BadBlock int64         // first block that failed, -1 if none
}
