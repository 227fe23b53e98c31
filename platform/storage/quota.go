package storage

import (
	"errors"
	"fmt"
	"os"
	"unsafe"

	"golang.org/x/sys/unix"
)

// Project quotas on the data volume: a directory tree tagged with a
// project ID is limited to that project's quota, whoever writes in it
// (ext4's quota feature with prjquota, set at mkfs; XFS's prjquota mount
// option). Local volumes were such directories before each became a
// filesystem of its own (platform/volumefs); the provisioner still reads
// and clears them when it removes a volume of that kind.
//
// Why quotactl(2) and no quota tools: the generic commands work alike on
// ext4 and XFS (Q_GETINFO, Q_SETQUOTA), and the node carries no
// quota(8).

const (
	prjQuota    = 2      // PRJQUOTA
	qXGetQStatV = 0x5808 // Q_XGETQSTATV: XQM_CMD(8)
	subCmdSft   = 8      // SUBCMDSHIFT

	fsQStatVVersion1 = 1      // FS_QSTATV_VERSION1
	fsQuotaPDQEnfd   = 1 << 5 // FS_QUOTA_PDQ_ENFD: project limits enforced
)

// fsQuotaStatV is struct fs_quota_statv: the quota state of a
// filesystem (generic quota and XFS alike).
type fsQuotaStatV struct {
	Version    int8
	_          uint8
	Flags      uint16
	InCoreDqs  uint32
	Files      [3]struct{ Ino, Nblks, Nextents uint64 } // fs_qfilestatv: ino, nblks, nextents+pad
	TimeLimits [3]int32
	WarnLimits [3]uint16
	_          uint16
	_          uint32
	_          [7]uint64
}

func qcmd(cmd, typ int) int { return cmd<<subCmdSft | typ&0xff }

// ProjectQuotaOn reports whether the filesystem on the block device dev
// (mounted) enforces project quota limits (accounting alone, as ext4's
// quota feature has without the prjquota mount option, is not enough). A
// filesystem without them is not an error: false.
func ProjectQuotaOn(dev string) (bool, error) {
	p, err := unix.BytePtrFromString(dev)
	if err != nil {
		return false, err
	}
	return projectLimitsEnforced(dev, func(st *fsQuotaStatV) error {
		_, _, errno := unix.Syscall6(unix.SYS_QUOTACTL, uintptr(qcmd(qXGetQStatV, prjQuota)), uintptr(unsafe.Pointer(p)), 0, uintptr(unsafe.Pointer(st)), 0, 0)
		if errno != 0 {
			return errno
		}
		return nil
	})
}

// projectLimitsEnforced asks get for the quota state: whether project
// limits are enforced.
func projectLimitsEnforced(of string, get func(*fsQuotaStatV) error) (bool, error) {
	st := fsQuotaStatV{Version: fsQStatVVersion1}
	switch err := get(&st); {
	case err == nil:
		return st.Flags&fsQuotaPDQEnfd != 0, nil
	case errors.Is(err, unix.ESRCH), errors.Is(err, unix.ENOSYS), errors.Is(err, unix.EINVAL), errors.Is(err, unix.ENOTTY):
		// ESRCH: no quota on this filesystem; ENOSYS: a filesystem
		// or kernel without quotas; EINVAL: a kernel without project
		// quotas.
		return false, nil
	default:
		return false, fmt.Errorf("quotactl Q_XGETQSTATV on %s: %w", of, err)
	}
}

// The calls below reach a filesystem through an open directory on it
// (quotactl_fd, Linux 5.14): the local volume provisioner knows its
// directory, not the block device under it.

const (
	qGetQuota  = 0x800007 // Q_GETQUOTA
	qSetQuota  = 0x800008 // Q_SETQUOTA
	qifBLimits = 1        // QIF_BLIMITS
	qifSpace   = 2        // QIF_SPACE
	// QuotaBlock is the unit of if_dqblk's space limits (QIF_DQBLKSIZE).
	QuotaBlock = 1024

	fsIocFSGetXattr    = 0x801c581f // FS_IOC_FSGETXATTR: _IOR('X', 31, struct fsxattr)
	fsIocFSSetXattr    = 0x401c5820 // FS_IOC_FSSETXATTR: _IOW('X', 32, struct fsxattr)
	fsXflagProjInherit = 0x200      // FS_XFLAG_PROJINHERIT
)

// ifDqblk is struct if_dqblk.
type ifDqblk struct {
	BHardLimit, BSoftLimit, CurSpace  uint64
	IHardLimit, ISoftLimit, CurInodes uint64
	BTime, ITime                      uint64
	Valid                             uint32
	_                                 uint32
}

// fsxattr is struct fsxattr.
type fsxattr struct {
	Xflags, Extsize, Nextents, Projid, Cowextsize uint32
	_                                             [8]byte
}

// quotactlFD runs quotactl_fd(2) on the filesystem holding dir.
func quotactlFD(dir string, cmd int, id uint32, addr unsafe.Pointer) error {
	f, err := os.Open(dir)
	if err != nil {
		return err
	}
	defer f.Close()
	_, _, errno := unix.Syscall6(unix.SYS_QUOTACTL_FD, f.Fd(), uintptr(qcmd(cmd, prjQuota)), uintptr(id), uintptr(addr), 0, 0)
	if errno != 0 {
		return errno
	}
	return nil
}

// ProjectQuotaOnDir is ProjectQuotaOn for the filesystem holding dir.
func ProjectQuotaOnDir(dir string) (bool, error) {
	return projectLimitsEnforced(dir, func(st *fsQuotaStatV) error {
		return quotactlFD(dir, qXGetQStatV, 0, unsafe.Pointer(st))
	})
}

// SetProjectLimit limits project id on the filesystem holding dir to
// limit bytes (rounded up to whole QuotaBlocks; 0 lifts the limit), hard
// and soft alike: a write past it fails at once.
func SetProjectLimit(dir string, id uint32, limit uint64) error {
	blocks := (limit + QuotaBlock - 1) / QuotaBlock
	q := ifDqblk{BHardLimit: blocks, BSoftLimit: blocks, Valid: qifBLimits}
	if err := quotactlFD(dir, qSetQuota, id, unsafe.Pointer(&q)); err != nil {
		return fmt.Errorf("quotactl_fd Q_SETQUOTA (project %d, %d bytes) on %s: %w", id, limit, dir, err)
	}
	return nil
}

// ProjectUsage is project id's space in use and its limit, in bytes,
// on the filesystem holding dir.
func ProjectUsage(dir string, id uint32) (used, limit uint64, err error) {
	var q ifDqblk
	if err := quotactlFD(dir, qGetQuota, id, unsafe.Pointer(&q)); err != nil {
		return 0, 0, fmt.Errorf("quotactl_fd Q_GETQUOTA (project %d) on %s: %w", id, dir, err)
	}
	if q.Valid&qifSpace != 0 {
		used = q.CurSpace
	}
	return used, q.BHardLimit * QuotaBlock, nil
}

// SetProject tags directory dir with project id, inherited by all it
// will hold (FS_XFLAG_PROJINHERIT). dir must be empty: what it holds
// already keeps its project.
func SetProject(dir string, id uint32) error {
	f, err := os.Open(dir)
	if err != nil {
		return err
	}
	defer f.Close()
	var x fsxattr
	if err := ioctl(f, fsIocFSGetXattr, unsafe.Pointer(&x)); err != nil {
		return fmt.Errorf("FS_IOC_FSGETXATTR on %s: %w", dir, err)
	}
	x.Projid = id
	x.Xflags |= fsXflagProjInherit
	if err := ioctl(f, fsIocFSSetXattr, unsafe.Pointer(&x)); err != nil {
		return fmt.Errorf("FS_IOC_FSSETXATTR (project %d) on %s: %w", id, dir, err)
	}
	return nil
}

// Project is the project ID of file or directory p (0: none).
func Project(p string) (uint32, error) {
	f, err := os.Open(p)
	if err != nil {
		return 0, err
	}
	defer f.Close()
	var x fsxattr
	if err := ioctl(f, fsIocFSGetXattr, unsafe.Pointer(&x)); err != nil {
		return 0, fmt.Errorf("FS_IOC_FSGETXATTR on %s: %w", p, err)
	}
	return x.Projid, nil
}

func ioctl(f *os.File, req uintptr, arg unsafe.Pointer) error {
	_, _, errno := unix.Syscall(unix.SYS_IOCTL, f.Fd(), req, uintptr(arg))
	if errno != 0 {
		return errno
	}
	return nil
}
