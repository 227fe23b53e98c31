// Package volumefs gives each local volume a filesystem of its own: an
// ext4 image file on the data volume, preallocated to the volume's
// size, attached to a loop device and mounted at the volume's
// directory.
//
//	/data/kubernetes/local-volume-images/<name>.img   fallocate(size), mkfs.ext4
//	        │ loop (autoclear)
//	        ▼
//	/data/kubernetes/local-volumes/<name>/   mount (nosuid, nodev), root 0777
//	        the directory beneath: empty, immutable (FS_IMMUTABLE_FL)
//
// Why a filesystem per volume and not a project quota: containers share
// the host's user namespace, where a file's owner may set its project ID
// (FS_IOC_FSSETXATTR: `chattr -p 0`), which takes its blocks out of the
// volume's quota; a pod could then fill the data volume that etcd,
// containerd and the kubelet share. A volume that is its own filesystem
// ends at its size whatever its files say, and its image was allocated
// whole when it was made: it never takes more of the data volume.
//
// Why the directory beneath is immutable: should a pod ever get the
// directory before its filesystem is mounted there (a boot that
// attached nothing), nothing it writes can land on the data volume:
// removing the flag takes CAP_LINUX_IMMUTABLE, which containers lack.
// Guarded by TestVolumeFilesystem (a real loop device and ext4) and
// TestKubernetesTwoNodes (checkVolumes: a pod resets its files' project
// and writes on).
package volumefs

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"strings"

	"golang.org/x/sys/unix"

	"plinth.dev/plinth/platform/loop"
)

// MinSize is the smallest filesystem made: an ext4 journal and its
// metadata need some of it.
const MinSize = 16 << 20

// mkfs is the program that makes a filesystem (the system image's).
var mkfs = "/usr/sbin/mkfs.ext4"

// ImageSize is the bytes of the image of a volume of size bytes: at
// least MinSize, and room for the filesystem's own metadata on top, so
// that the volume holds about what it was asked for.
func ImageSize(size int64) int64 {
	s := size + size/32 + 4<<20
	s = (s + 1<<20 - 1) &^ (1<<20 - 1)
	return max(s, MinSize)
}

// Make makes volume dir's filesystem in image, of ImageSize(size)
// bytes, and mounts it. Made again from the start if an earlier try
// left it half done (an image that no mount uses).
func Make(ctx context.Context, dir, image string, size int64) error {
	if mounted, err := Mounted(dir); err != nil || mounted {
		return err
	}
	if err := underneath(dir); err != nil {
		return err
	}
	if err := os.MkdirAll(filepath.Dir(image), 0o700); err != nil {
		return err
	}
	f, err := os.OpenFile(image, os.O_RDWR|os.O_CREATE|os.O_TRUNC, 0o600)
	if err != nil {
		return err
	}
	// Allocated now, whole: the data volume's free space is what is
	// left, and the volume can never take more.
	err = unix.Fallocate(int(f.Fd()), 0, 0, ImageSize(size))
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		os.Remove(image)
		return fmt.Errorf("allocating %s: %w", image, err)
	}
	// nodiscard: mke2fs would punch the allocation out of a file again.
	cmd := exec.CommandContext(ctx, mkfs, "-q", "-F", "-m", "0", "-L", "plinth-volume", "-E", "lazy_itable_init=0,lazy_journal_init=0,nodiscard", image)
	if out, err := cmd.CombinedOutput(); err != nil {
		os.Remove(image)
		return fmt.Errorf("%s %s: %w: %s", mkfs, image, err, strings.TrimSpace(string(out)))
	}
	if err := mount(dir, image); err != nil {
		return err
	}
	// Pods of any UID write here.
	return os.Chmod(dir, 0o777)
}

// Attach mounts image's filesystem at dir unless something is mounted
// there already.
func Attach(dir, image string) error {
	if mounted, err := Mounted(dir); err != nil || mounted {
		return err
	}
	if err := underneath(dir); err != nil {
		return err
	}
	return mount(dir, image)
}

// AttachAll attaches every image <name>.img in images at dir/<name>,
// and returns how many it attached.
func AttachAll(dir, images string) (int, error) {
	entries, err := os.ReadDir(images)
	if errors.Is(err, fs.ErrNotExist) {
		return 0, nil
	}
	if err != nil {
		return 0, err
	}
	n := 0
	var errs []error
	for _, e := range entries {
		name, ok := strings.CutSuffix(e.Name(), ".img")
		if !ok || !e.Type().IsRegular() {
			continue
		}
		if err := Attach(filepath.Join(dir, name), filepath.Join(images, e.Name())); err != nil {
			errs = append(errs, fmt.Errorf("volume %s: %w", name, err))
			continue
		}
		n++
	}
	return n, errors.Join(errs...)
}

// Remove unmounts volume dir (its loop device goes with the mount),
// removes its image and the directory.
func Remove(dir, image string) error {
	if mounted, err := Mounted(dir); err != nil {
		return err
	} else if mounted {
		if err := unix.Unmount(dir, 0); err != nil {
			return fmt.Errorf("unmounting %s: %w", dir, err)
		}
	}
	if err := os.Remove(image); err != nil && !errors.Is(err, fs.ErrNotExist) {
		return err
	}
	if err := setImmutable(dir, false); err != nil {
		if errors.Is(err, fs.ErrNotExist) {
			return nil
		}
		return err
	}
	return os.Remove(dir)
}

// Mounted reports whether something is mounted at dir.
func Mounted(dir string) (bool, error) {
	f, err := os.Open("/proc/self/mountinfo")
	if err != nil {
		return false, err
	}
	defer f.Close()
	clean := filepath.Clean(dir)
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		if fields := strings.Fields(sc.Text()); len(fields) > 4 && unescape(fields[4]) == clean {
			return true, nil
		}
	}
	return false, sc.Err()
}

// unescape undoes mountinfo's octal escapes (\040 for a space).
func unescape(s string) string {
	if !strings.Contains(s, `\`) {
		return s
	}
	var b strings.Builder
	for i := 0; i < len(s); i++ {
		if s[i] == '\\' && i+3 < len(s) {
			var c byte
			if _, err := fmt.Sscanf(s[i+1:i+4], "%03o", &c); err == nil {
				b.WriteByte(c)
				i += 3
				continue
			}
		}
		b.WriteByte(s[i])
	}
	return b.String()
}

// underneath makes dir, empty and immutable, for a mount.
func underneath(dir string) error {
	if err := os.Mkdir(dir, 0o755); err != nil && !errors.Is(err, fs.ErrExist) {
		return err
	}
	return setImmutable(dir, true)
}

// mount attaches image to a loop device that goes with the mount, and
// mounts its ext4 at dir.
func mount(dir, image string) error {
	dev, f, err := loop.AttachAutoclear(image)
	if err != nil {
		return err
	}
	// Closed once mounted: the device then lives as long as the mount.
	defer f.Close()
	if err := unix.Mount(dev, dir, "ext4", unix.MS_NOSUID|unix.MS_NODEV, ""); err != nil {
		return fmt.Errorf("mounting %s at %s: %w", image, dir, err)
	}
	return nil
}

// fsImmutable is FS_IMMUTABLE_FL (linux/fs.h), which x/sys/unix does
// not name.
const fsImmutable = 0x00000010

// setImmutable sets or clears dir's immutable flag.
func setImmutable(dir string, on bool) error {
	f, err := os.Open(dir)
	if err != nil {
		return err
	}
	defer f.Close()
	flags, err := unix.IoctlGetUint32(int(f.Fd()), unix.FS_IOC_GETFLAGS)
	if err != nil {
		return fmt.Errorf("the flags of %s: %w", dir, err)
	}
	next := flags &^ fsImmutable
	if on {
		next |= fsImmutable
	}
	if next == flags {
		return nil
	}
	if err := unix.IoctlSetPointerInt(int(f.Fd()), unix.FS_IOC_SETFLAGS, int(next)); err != nil {
		return fmt.Errorf("setting the flags of %s: %w", dir, err)
	}
	return nil
}
