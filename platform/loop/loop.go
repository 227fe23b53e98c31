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
	flag := os.O_RDWR
	if readOnly {
		flag = os.O_RDONLY
	}
	backing, err := os.OpenFile(file, flag, 0)
	if err != nil {
		return "", err
	}
	defer backing.Close()
	ctl, err := os.OpenFile("/dev/loop-control", os.O_RDWR, 0)
	if err != nil {
		return "", fmt.Errorf("loop: %w (is the loop module loaded?)", err)
	}
	defer ctl.Close()
	// Another process can grab the free device between GET_FREE and
	// CONFIGURE (EBUSY): try again with the next free one.
	for attempt := 0; attempt < 8; attempt++ {
		n, err := unix.IoctlRetInt(int(ctl.Fd()), unix.LOOP_CTL_GET_FREE)
		if err != nil {
			return "", fmt.Errorf("loop: get free device: %w", err)
		}
		dev := fmt.Sprintf("/dev/loop%d", n)
		if _, err := os.Stat(dev); os.IsNotExist(err) {
			if err := unix.Mknod(dev, unix.S_IFBLK|0o600, int(unix.Mkdev(7, uint32(n)))); err != nil {
				return "", fmt.Errorf("loop: mknod %s: %w", dev, err)
			}
		}
		lf, err := os.OpenFile(dev, flag, 0)
		if err != nil {
			return "", err
		}
		cfg := unix.LoopConfig{Fd: uint32(backing.Fd())}
		if readOnly {
			cfg.Info.Flags |= unix.LO_FLAGS_READ_ONLY
		}
		err = unix.IoctlLoopConfigure(int(lf.Fd()), &cfg)
		lf.Close()
		if err == unix.EBUSY {
			continue
		}
		if err != nil {
			return "", fmt.Errorf("loop: configure %s for %s: %w", dev, file, err)
		}
		return dev, nil
	}
	return "", fmt.Errorf("loop: no free loop device for %s", file)
}
