// Package mount holds the mount steps of an early boot: the pseudo
// filesystems, and switching root from the initramfs into the system image.
package mount

import (
	"bufio"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"

	"golang.org/x/sys/unix"
)

// Mount is one mount(2) call.
type Mount struct {
	Source, Target, FSType string
	Flags                  uintptr
	Data                   string
}

// All mounts ms in order, creating targets. A target that already has this
// filesystem mounted (EBUSY) is accepted, so a restarted step is harmless.
func All(ms []Mount) error {
	for _, m := range ms {
		if err := os.MkdirAll(m.Target, 0o755); err != nil {
			return err
		}
		if err := unix.Mount(m.Source, m.Target, m.FSType, m.Flags, m.Data); err != nil && !errors.Is(err, unix.EBUSY) {
			return fmt.Errorf("mount %s on %s: %w", m.FSType, m.Target, err)
		}
	}
	return nil
}

// SwitchRoot makes newRoot the root of this process (and its future
// children): it moves the given live mounts (e.g. /dev, /proc) into it,
// moves newRoot over / and chroots. The initramfs stays underneath, which
// is what the system image's loop device reads from.
//
// This is the classic switch_root, not pivot_root: the initramfs rootfs
// cannot be pivoted away from. Afterwards / is a real mount, which the
// OCI runtime (crun) needs for its own pivot_root.
func SwitchRoot(newRoot string, move []string) error {
	for _, m := range move {
		target := filepath.Join(newRoot, m)
		if err := os.MkdirAll(target, 0o755); err != nil && !errors.Is(err, unix.EROFS) {
			return err
		}
		if err := unix.Mount(m, target, "", unix.MS_MOVE, ""); err != nil {
			return fmt.Errorf("switch root: move %s: %w", m, err)
		}
	}
	if err := unix.Chdir(newRoot); err != nil {
		return err
	}
	if err := unix.Mount(newRoot, "/", "", unix.MS_MOVE, ""); err != nil {
		return fmt.Errorf("switch root: move %s to /: %w", newRoot, err)
	}
	if err := unix.Chroot("."); err != nil {
		return fmt.Errorf("switch root: chroot: %w", err)
	}
	return unix.Chdir("/")
}

// Info describes one entry of /proc/self/mountinfo.
type Info struct {
	MountPoint string
	FSType     string
	Source     string
	Options    []string
}

// ReadOnly reports whether the mount is read-only.
func (i Info) ReadOnly() bool {
	for _, o := range i.Options {
		if o == "ro" {
			return true
		}
	}
	return false
}

// Find returns the mountinfo entry of mountPoint (the top one if stacked).
func Find(mountPoint string) (Info, error) {
	f, err := os.Open("/proc/self/mountinfo")
	if err != nil {
		return Info{}, err
	}
	defer f.Close()
	var found *Info
	s := bufio.NewScanner(f)
	for s.Scan() {
		// ID PARENT MAJ:MIN ROOT MOUNTPOINT OPTIONS [OPTIONAL...] - FSTYPE SOURCE SUPEROPTS
		pre, post, ok := strings.Cut(s.Text(), " - ")
		if !ok {
			continue
		}
		a, b := strings.Fields(pre), strings.Fields(post)
		if len(a) < 6 || len(b) < 2 || a[4] != mountPoint {
			continue
		}
		found = &Info{MountPoint: a[4], Options: strings.Split(a[5], ","), FSType: b[0], Source: b[1]}
	}
	if found == nil {
		return Info{}, fmt.Errorf("%s is not a mount point", mountPoint)
	}
	return *found, s.Err()
}
