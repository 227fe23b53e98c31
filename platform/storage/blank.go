package storage

import (
	"bytes"
	"fmt"
	"io"
)

// BlankCheckSize is how much of each end of a disk DiskIsBlank reads.
//
// The first MiB holds every partition table (MBR, GPT primary) and the
// superblock or label of every common filesystem and volume format placed
// directly on a disk: XFS, LUKS, LVM, MD 1.1/1.2 and bcache at or near 0,
// ext2/3/4 at 1 KiB, swap at 4 KiB, ISO 9660 at 32 KiB, btrfs at 64 KiB,
// ZFS labels in the first 512 KiB. The last MiB holds the GPT backup, MD
// 0.90/1.0 superblocks and the two trailing ZFS labels.
const BlankCheckSize = 1 << 20

// zeroChunk is compared against; 64 KiB keeps reads large and memory small.
var zeroChunk = make([]byte, 64<<10)

// IsBlank reports whether the n bytes at off are all zero. Reading past
// the end of r is an error, not "blank": a short device must not pass.
func IsBlank(r io.ReaderAt, off, n int64) (bool, error) {
	if off < 0 || n < 0 {
		return false, fmt.Errorf("storage: IsBlank: negative range %d+%d", off, n)
	}
	buf := make([]byte, min(n, int64(len(zeroChunk))))
	for n > 0 {
		b := buf[:min(n, int64(len(buf)))]
		got, err := r.ReadAt(b, off)
		if got != len(b) {
			if err == nil || err == io.EOF {
				err = io.ErrUnexpectedEOF
			}
			return false, fmt.Errorf("storage: read at %d: %w", off, err)
		}
		if !bytes.Equal(b, zeroChunk[:len(b)]) {
			return false, nil
		}
		off += int64(len(b))
		n -= int64(len(b))
	}
	return true, nil
}

// DiskIsBlank reports whether the first and the last BlankCheckSize bytes
// of a disk of size bytes are all zero, which is what a new or wiped disk
// looks like and what no partitioned or formatted disk looks like. It is
// the only condition under which Plinth may partition a disk. On disks
// smaller than 2 MiB the two ranges overlap, covering the whole disk.
func DiskIsBlank(r io.ReaderAt, size int64) (bool, error) {
	if size <= 0 {
		return false, fmt.Errorf("storage: DiskIsBlank: disk size %d", size)
	}
	n := min(size, BlankCheckSize)
	if blank, err := IsBlank(r, 0, n); !blank || err != nil {
		return false, err
	}
	return IsBlank(r, size-n, n)
}
