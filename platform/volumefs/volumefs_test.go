package volumefs

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"unsafe"

	"golang.org/x/sys/unix"
)

// TestVolumeFilesystem attacks a volume as its pod would, on a real
// loop device and ext4 (the test runs as root, as the unit tests do):
// with its files' project ID reset (FS_IOC_FSSETXATTR, `chattr -p 0`) it
// writes 200 MiB into a 1 MiB volume; the writes stop at the volume's
// filesystem (ENOSPC), and the data volume's free space does not move
// (the image was allocated whole when it was made; the data volume is
// an ext4 of its own here too). Unmounted, the
// directory takes no file, root's neither; attached again (as at a
// boot), the data is there; removed, nothing is left.
func TestVolumeFilesystem(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Fatal("needs root (loop devices, mounts): make unit runs as root")
	}
	// The data volume: an ext4 of its own, as on a node.
	base := filepath.Join(t.TempDir(), "data")
	if err := Make(t.Context(), base, base+".img", 64<<20); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { Remove(base, base+".img") })
	dir, images := filepath.Join(base, "volumes"), filepath.Join(base, "images")
	if err := os.MkdirAll(dir, 0o700); err != nil {
		t.Fatal(err)
	}
	vol, image := filepath.Join(dir, "pvc-1"), filepath.Join(images, "pvc-1.img")
	if err := Make(t.Context(), vol, image, 1<<20); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { Remove(vol, image) })
	if st, err := os.Stat(image); err != nil || st.Size() != MinSize {
		t.Fatalf("image: %v, %v; want %d bytes", st, err, MinSize)
	}
	if st, err := os.Stat(vol); err != nil || st.Mode().Perm() != 0o777 {
		t.Fatalf("the volume's root: %v, %v; want mode 0777", st, err)
	}
	var before unix.Statfs_t
	if err := unix.Statfs(base, &before); err != nil {
		t.Fatal(err)
	}
	f, err := os.Create(filepath.Join(vol, "f"))
	if err != nil {
		t.Fatal(err)
	}
	if err := setProject(f, 0); err != nil {
		t.Logf("resetting the file's project: %v (the volume's ext4 has no project quota: nothing to escape)", err)
	}
	buf := make([]byte, 1<<20)
	var wrote int64
	for wrote < 200<<20 {
		n, err := f.Write(buf)
		wrote += int64(n)
		if err != nil {
			if !errors.Is(err, unix.ENOSPC) {
				t.Fatalf("writing: %v, want ENOSPC", err)
			}
			break
		}
	}
	f.Sync()
	f.Close()
	if wrote > MinSize {
		t.Fatalf("wrote %d bytes into a volume whose image has %d", wrote, MinSize)
	}
	var after unix.Statfs_t
	if err := unix.Statfs(base, &after); err != nil {
		t.Fatal(err)
	}
	if drop := (int64(before.Bfree) - int64(after.Bfree)) * int64(after.Bsize); drop > 1<<20 {
		t.Errorf("the data volume lost %d bytes to the volume's writes", drop)
	}
	t.Logf("wrote %d bytes into a 1 MiB volume (image %d), then ENOSPC", wrote, MinSize)

	// Unmounted: the directory beneath takes nothing.
	if err := unix.Unmount(vol, 0); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(vol, "x"), []byte("x"), 0o644); !errors.Is(err, os.ErrPermission) {
		t.Errorf("writing into the volume's directory while unmounted: %v, want EPERM (immutable)", err)
	}
	if n, err := AttachAll(dir, images); err != nil || n != 1 {
		t.Fatalf("AttachAll: %d, %v", n, err)
	}
	if st, err := os.Stat(filepath.Join(vol, "f")); err != nil || st.Size() != wrote {
		t.Fatalf("the file after attaching again: %v, %v", st, err)
	}
	if err := Remove(vol, image); err != nil {
		t.Fatal(err)
	}
	for _, p := range []string{vol, image} {
		if _, err := os.Stat(p); !errors.Is(err, os.ErrNotExist) {
			t.Errorf("%s after Remove: %v", p, err)
		}
	}
	if b, _ := os.ReadFile("/proc/self/mountinfo"); strings.Contains(string(b), vol) {
		t.Error("the volume is still mounted")
	}
}

// fsxattr is struct fsxattr (linux/fs.h).
type fsxattr struct {
	Xflags     uint32
	Extsize    uint32
	Nextents   uint32
	Projid     uint32
	Cowextsize uint32
	Pad        [8]byte
}

// setProject sets f's project ID, as `chattr -p` does.
func setProject(f *os.File, id uint32) error {
	var a fsxattr
	if _, _, e := unix.Syscall(unix.SYS_IOCTL, f.Fd(), uintptr(0x801c581f), uintptr(unsafe.Pointer(&a))); e != 0 {
		return e
	}
	a.Projid = id
	if _, _, e := unix.Syscall(unix.SYS_IOCTL, f.Fd(), uintptr(0x401c5820), uintptr(unsafe.Pointer(&a))); e != 0 {
		return e
	}
	return nil
}
