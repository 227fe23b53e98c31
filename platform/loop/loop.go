// Package loop attaches files to loop block devices (LOOP_CONFIGURE).
package loop

import (
	"fmt"
	"os"

	"golang.org/x/sys/unix"
)

// Attach binds file to a free loop device and returns the device path.
// The loop device keeps its own reference to the file.
func Attach(file string, readOnly bool) (string, error) {
	dev, f, err := attach(file, readOnly, 0)
	if f != nil {
		f.Close()
	}
	return dev, err
}

// AttachAutoclear is Attach (read-write) of a device that detaches
// itself when its last user closes it: a filesystem mounted from it
// takes it along when it is unmounted. The device is open in the file
// returned, which the caller closes once something else uses the
// device (the mount): closed before, the device is gone.
func AttachAutoclear(file string) (string, *os.File, error) {
	return attach(file, false, unix.LO_FLAGS_AUTOCLEAR)
}

// Detach detaches loop device dev from its file.
func Detach(dev string) error {
	f, err := os.OpenFile(dev, os.O_RDWR, 0)
	if err != nil {
		return err
	}
	defer f.Close()
	return unix.IoctlSetInt(int(f.Fd()), unix.LOOP_CLR_FD, 0)
}

func attach(file string, readOnly bool, flags uint32) (string, *os.File, error) {
	flag := os.O_RDWR
	if readOnly {
		flag = os.O_RDONLY
	}
	backing, err := os.OpenFile(file, flag, 0)
	if err != nil {
		return "", nil, err
	}
	defer backing.Close()
	ctl, err := os.OpenFile("/dev/loop-control", os.O_RDWR, 0)
	if err != nil {
		return "", nil, fmt.Errorf("loop: %w (is the loop module loaded?)", err)
	}
	defer ctl.Close()
	// Another process can grab the free device between GET_FREE and
	// CONFIGURE (EBUSY): try again with the next free one.
	for attempt := 0; attempt < 8; attempt++ {
		n, err := unix.IoctlRetInt(int(ctl.Fd()), unix.LOOP_CTL_GET_FREE)
		if err != nil {
			return "", nil, fmt.Errorf("loop: get free device: %w", err)
		}
		dev := fmt.Sprintf("/dev/loop%d", n)
		if _, err := os.Stat(dev); os.IsNotExist(err) {
			if err := unix.Mknod(dev, unix.S_IFBLK|0o600, int(unix.Mkdev(7, uint32(n)))); err != nil {
				return "", nil, fmt.Errorf("loop: mknod %s: %w", dev, err)
			}
		}
		lf, err := os.OpenFile(dev, flag, 0)
		if err != nil {
			return "", nil, err
		}
		cfg := unix.LoopConfig{Fd: uint32(backing.Fd())}
		cfg.Info.Flags |= flags
		if readOnly {
			cfg.Info.Flags |= unix.LO_FLAGS_READ_ONLY
		}
		err = unix.IoctlLoopConfigure(int(lf.Fd()), &cfg)
		if err == unix.EBUSY {
			lf.Close()
			continue
		}
		if err != nil {
			lf.Close()
			return "", nil, fmt.Errorf("loop: configure %s for %s: %w", dev, file, err)
		}
		return dev, lf, nil
	}
	return "", nil, fmt.Errorf("loop: no free loop device for %s", file)
}
