package storage

import (
	"testing"
	"unsafe"
)

// TestQuotaABI: the structures passed to quotactl and the FS_IOC_FS*XATTR
// ioctls have the kernel's sizes (the ioctl numbers encode fsxattr's),
// and asking a filesystem without project quotas (this host's kernel
// has no quota support) is an answer, not an error.
func TestQuotaABI(t *testing.T) {
	for _, c := range []struct {
		name      string
		got, want uintptr
	}{
		{"struct fs_quota_statv", unsafe.Sizeof(fsQuotaStatV{}), 160},
		{"struct if_dqblk", unsafe.Sizeof(ifDqblk{}), 72},
		{"struct fsxattr", unsafe.Sizeof(fsxattr{}), 28},
		{"FS_IOC_FSGETXATTR's size", fsIocFSGetXattr >> 16 & 0x3fff, unsafe.Sizeof(fsxattr{})},
		{"FS_IOC_FSSETXATTR's size", fsIocFSSetXattr >> 16 & 0x3fff, unsafe.Sizeof(fsxattr{})},
	} {
		if c.got != c.want {
			t.Errorf("%s: %d bytes, want %d", c.name, c.got, c.want)
		}
	}
	if on, err := ProjectQuotaOnDir(t.TempDir()); err != nil {
		t.Errorf("ProjectQuotaOnDir: %v, %v", on, err)
	}
}
