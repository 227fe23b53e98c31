package storage

import (
	"errors"
	"fmt"
	"unsafe"

	"golang.org/x/sys/unix"
)

// Project quotas on the data volume: a directory tree tagged with a
// project ID is limited to that project's quota, whoever writes in it
// (ext4's quota feature with prjquota, set at mkfs; XFS's prjquota mount
// option). They are what bounds a local volume, so that a pod that fills
// its volume gets ENOSPC while the node's own state on /data keeps room.
//
// Why quotactl(2) and no quota tools: the generic commands work alike on
// ext4 and XFS (Q_GETINFO, Q_SETQUOTA), and the node carries no
// quota(8).

const (
	prjQuota  = 2        // PRJQUOTA
	qGetInfo  = 0x800005 // Q_GETINFO
	subCmdSft = 8        // SUBCMDSHIFT
)

// ifDqinfo is struct if_dqinfo.
type ifDqinfo struct {
	Bgrace, Igrace uint64
	Flags, Valid   uint32
}

func qcmd(cmd, typ int) int { return cmd<<subCmdSft | typ&0xff }

// ProjectQuotaOn reports whether the filesystem on the block device dev
// (mounted) accounts project quotas. A filesystem without them is not an
// error: false.
func ProjectQuotaOn(dev string) (bool, error) {
	p, err := unix.BytePtrFromString(dev)
	if err != nil {
		return false, err
	}
	var info ifDqinfo
	_, _, errno := unix.Syscall6(unix.SYS_QUOTACTL, uintptr(qcmd(qGetInfo, prjQuota)), uintptr(unsafe.Pointer(p)), 0, uintptr(unsafe.Pointer(&info)), 0, 0)
	switch {
	case errno == 0:
		return true, nil
	case errors.Is(errno, unix.ESRCH), errors.Is(errno, unix.ENOSYS), errors.Is(errno, unix.EINVAL):
		// ESRCH: no project quota on this filesystem; ENOSYS: none of
		// any kind; EINVAL: a kernel without project quotas.
		return false, nil
	}
	return false, fmt.Errorf("quotactl Q_GETINFO (project) on %s: %w", dev, errno)
}
