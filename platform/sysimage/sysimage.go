// Package sysimage opens the read-only system image carried in the
// initramfs: it attaches the file to a loop device, puts a dm-verity target
// on it whose root hash came from the (measured) kernel command line,
// reads it all once so a tampered image is refused before anything from it
// is used, and mounts it read-only.
//
//	/system.img ──► /dev/loopN ──► dm-verity "system" ──► full read (verify) ──► mount squashfs ro
package sysimage

import (
	"errors"
	"fmt"
	"io"
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
	Loop         string
	Device       string
	Verified     int64 // bytes read through verity
	VerifyTime   time.Duration
	VerityStatus string // the kernel's verity status: "V" verified, "C" corruption seen
}

// Open maps file through dm-verity and verifies every data block.
func Open(file string, p verity.Params) (*Result, error) {
	r := &Result{}
	var err error
	if r.Loop, err = loop.Attach(file, true); err != nil {
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
	d, err := devicemapper.Create(DeviceName)
	if err != nil {
		return nil, err
	}
	r.Device = d.Path()
	if err := devicemapper.LoadTable(DeviceName, targets, true); err != nil {
		devicemapper.Remove(DeviceName)
		return nil, err
	}
	if err := devicemapper.Resume(DeviceName); err != nil {
		devicemapper.Remove(DeviceName)
		return nil, err
	}
	start := time.Now()
	r.Verified, err = readAll(r.Device)
	r.VerifyTime = time.Since(start)
	if ts, serr := devicemapper.Status(DeviceName, false); serr == nil && len(ts) == 1 {
		r.VerityStatus = ts[0].Params
	}
	if err != nil || r.VerityStatus == "C" {
		devicemapper.Remove(DeviceName)
		return r, fmt.Errorf("%w: verification failed after %d bytes (status %q): %v", ErrTampered, r.Verified, r.VerityStatus, err)
	}
	return r, nil
}

func readAll(dev string) (int64, error) {
	f, err := os.Open(dev)
	if err != nil {
		return 0, err
	}
	defer f.Close()
	buf := make([]byte, 1<<20)
	var total int64
	for {
		n, err := f.Read(buf)
		total += int64(n)
		if err == io.EOF {
			return total, nil
		}
		if err != nil {
			return total, err
		}
	}
}

// Mount mounts the verified device read-only at target.
func Mount(dev, target, fstype string) error {
	if err := os.MkdirAll(target, 0o755); err != nil {
		return err
	}
	if err := unix.Mount(dev, target, fstype, unix.MS_RDONLY|unix.MS_NODEV, ""); err != nil {
		return fmt.Errorf("mounting system image %s (%s) at %s: %w", dev, fstype, target, err)
	}
	return nil
}
