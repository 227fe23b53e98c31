package image

import (
	"bufio"
	"bytes"
	"context"
	"crypto/sha256"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"time"

	"golang.org/x/sys/unix"

	"plinth.dev/plinth/platform/gpt"
	"plinth.dev/plinth/platform/layout"
)

// Writing disk.img onto a disk (`plinthctl write-disk`), what gokrazy's
// `gok overwrite --full` does for its images:
//
//	checks (nothing written if one fails): the target is not mounted or
//	  held open, is large enough for the image and a data partition, and
//	  holds no Plinth data partition (unless Force)
//	the ESP with the node's parameters ──┐
//	disk.img, all other bytes ───────────┴─► target, with progress
//	read back, compared by SHA-256 ─► done
//
// A regular file is a target too (a VM's disk): it is created when
// missing, grown to Size, and written sparsely.

// MinDataBytes is the least room a target must have beyond disk.img, for
// the data partition the node adds on first boot.
const MinDataBytes = 1 << 30

// ErrTargetRefused wraps every reason WriteDisk will not write a target.
var ErrTargetRefused = errors.New("refusing to write the disk")

// WriteDiskConfig says what WriteDisk writes where.
type WriteDiskConfig struct {
	// ImageDir is a build's output directory (disk.img, manifest.json).
	ImageDir string
	// Parameters is the node parameters document (binary protobuf), put at
	// plinth/parameters.pb on the ESP. Required: a node without them
	// waits on its console.
	Parameters []byte
	// Target is a block device or a file.
	Target string
	// Size is the size of a file target created or grown (0: disk.img's
	// size plus MinDataBytes). Ignored for devices.
	Size int64
	// Force writes over a Plinth data partition (it is lost).
	Force bool
	// Progress receives progress lines; nil is silent.
	Progress io.Writer
}

// WriteDisk writes the image's disk.img and the parameters onto
// c.Target, then reads it back and compares.
func WriteDisk(ctx context.Context, c WriteDiskConfig) error {
	m, err := ReadManifest(c.ImageDir)
	if err != nil {
		return err
	}
	if m.Disk == nil || len(m.Disk.Partitions) == 0 {
		return fmt.Errorf("%w: the image in %s has no disk image (rebuild it)", ErrTargetRefused, c.ImageDir)
	}
	if len(c.Parameters) == 0 {
		return fmt.Errorf("%w: no node parameters (plinthctl params writes them)", ErrTargetRefused)
	}
	progress := c.Progress
	if progress == nil {
		progress = io.Discard
	}
	src := filepath.Join(c.ImageDir, DiskFile)
	tmp, err := os.MkdirTemp("", "plinth-write-disk")
	if err != nil {
		return err
	}
	defer os.RemoveAll(tmp)
	espPart := m.Disk.Partitions[0]
	espOff := int64(espPart.FirstLBA) * gpt.SectorSize
	espSize := int64(espPart.LastLBA-espPart.FirstLBA+1) * gpt.SectorSize
	esp, err := espWithParameters(ctx, src, espOff, espSize, c.Parameters, filepath.Join(tmp, "esp.img"))
	if err != nil {
		return err
	}

	f, isFile, created, err := openTarget(c, m.Disk.Size)
	if err != nil {
		return err
	}
	defer f.Close()
	size, err := f.Seek(0, io.SeekEnd)
	if err != nil {
		return err
	}
	if size < m.Disk.Size+MinDataBytes {
		return fmt.Errorf("%w: %s holds %s; the image needs %s and at least %s for the node's data", ErrTargetRefused, c.Target, mib(size), mib(m.Disk.Size), mib(MinDataBytes))
	}
	if !c.Force {
		if t, err := gpt.Read(f, size); err == nil {
			if len(t.FindAll(dataPartitionType)) > 0 {
				return fmt.Errorf("%w: %s holds a Plinth data partition (a node's data); --force writes over it", ErrTargetRefused, c.Target)
			}
		}
	}

	in, err := os.Open(src)
	if err != nil {
		return err
	}
	defer in.Close()
	fmt.Fprintf(progress, "writing %s (%s) and the node parameters to %s\n", DiskFile, mib(m.Disk.Size), c.Target)
	written := sha256.New()
	if err := copyImage(ctx, f, in, esp, espOff, m.Disk.Size, created, written, progress); err != nil {
		return err
	}
	if err := f.Sync(); err != nil {
		return err
	}
	if !isFile {
		// Drop the device's cached pages, so the read-back reads the disk.
		unix.IoctlSetInt(int(f.Fd()), unix.BLKFLSBUF, 0)
	}
	fmt.Fprintf(progress, "reading %s back\n", c.Target)
	read := sha256.New()
	if _, err := io.Copy(read, io.NewSectionReader(f, 0, m.Disk.Size)); err != nil {
		return fmt.Errorf("reading %s back: %w", c.Target, err)
	}
	if !bytes.Equal(read.Sum(nil), written.Sum(nil)) {
		return fmt.Errorf("%s reads back differently from what was written: the disk is faulty or was changed meanwhile", c.Target)
	}
	fmt.Fprintf(progress, "done: %s written and verified (sha256 %x)\n", mib(m.Disk.Size), read.Sum(nil)[:8])
	return nil
}

// dataPartitionType is storage.DataPartitionType (the builder does not
// link the storage package; a test checks they agree).
var dataPartitionType = gpt.MustParseGUID("B9067454-6B66-4704-A677-45E0D8925A0F")

// espWithParameters copies the ESP out of disk.img into out and adds the
// parameters file to it.
func espWithParameters(ctx context.Context, disk string, off, size int64, params []byte, out string) ([]byte, error) {
	f, err := os.Open(disk)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	esp := make([]byte, size)
	if _, err := f.ReadAt(esp, off); err != nil {
		return nil, fmt.Errorf("reading the ESP of %s: %w", disk, err)
	}
	if err := os.WriteFile(out, esp, 0o600); err != nil {
		return nil, err
	}
	pf := out + ".params"
	if err := os.WriteFile(pf, params, 0o600); err != nil {
		return nil, err
	}
	for _, c := range [][]string{
		{"mmd", "-D", "s", "-i", out, "::" + filepath.Dir(layout.ESPParameters)},
		{"mcopy", "-o", "-i", out, pf, "::" + layout.ESPParameters},
	} {
		cmd := exec.CommandContext(ctx, c[0], c[1:]...)
		cmd.Env = append(os.Environ(), "MTOOLS_SKIP_CHECK=1")
		if o, err := cmd.CombinedOutput(); err != nil {
			return nil, fmt.Errorf("%s: %v: %s (make deps installs mtools)", strings.Join(c, " "), err, bytes.TrimSpace(o))
		}
	}
	return os.ReadFile(out)
}

// openTarget opens c.Target for writing after checking nothing uses it: a
// file is created or grown; a block device must not be mounted (nor any
// of its partitions) and is opened exclusively, which the kernel refuses
// while anything holds it (a mount, device-mapper, another O_EXCL).
func openTarget(c WriteDiskConfig, imageSize int64) (f *os.File, isFile, created bool, err error) {
	st, err := os.Stat(c.Target)
	switch {
	case errors.Is(err, os.ErrNotExist):
		size := c.Size
		if size == 0 {
			size = imageSize + MinDataBytes
		}
		if size < imageSize+MinDataBytes {
			return nil, false, false, fmt.Errorf("%w: --size %s is less than the image (%s) and %s for the node's data", ErrTargetRefused, mib(size), mib(imageSize), mib(MinDataBytes))
		}
		if f, err = os.OpenFile(c.Target, os.O_RDWR|os.O_CREATE|os.O_EXCL, 0o644); err != nil {
			return nil, false, false, err
		}
		if err := f.Truncate(size); err != nil {
			f.Close()
			os.Remove(c.Target)
			return nil, false, false, err
		}
		return f, true, true, nil
	case err != nil:
		return nil, false, false, err
	case st.Mode().IsRegular():
		if f, err = os.OpenFile(c.Target, os.O_RDWR, 0); err != nil {
			return nil, false, false, err
		}
		if c.Size > st.Size() {
			if err := f.Truncate(c.Size); err != nil {
				f.Close()
				return nil, false, false, err
			}
		}
		return f, true, false, nil
	case st.Mode()&os.ModeDevice == 0 || st.Mode()&os.ModeCharDevice != 0:
		return nil, false, false, fmt.Errorf("%w: %s is neither a block device nor a file", ErrTargetRefused, c.Target)
	}
	if where, err := mountedFrom("/proc/self/mountinfo", c.Target); err != nil {
		return nil, false, false, err
	} else if where != "" {
		return nil, false, false, fmt.Errorf("%w: %s is mounted (%s); unmount it first", ErrTargetRefused, c.Target, where)
	}
	f, err = os.OpenFile(c.Target, os.O_RDWR|unix.O_EXCL, 0)
	if errors.Is(err, unix.EBUSY) {
		return nil, false, false, fmt.Errorf("%w: %s is in use (held by a mount, device-mapper or another program)", ErrTargetRefused, c.Target)
	}
	return f, false, false, err
}

// mountedFrom returns where the device dev or one of its partitions is
// mounted, according to the mountinfo file; "" if nowhere.
func mountedFrom(mountinfo, dev string) (string, error) {
	f, err := os.Open(mountinfo)
	if err != nil {
		return "", err
	}
	defer f.Close()
	real, err := filepath.EvalSymlinks(dev)
	if err != nil {
		real = dev
	}
	s := bufio.NewScanner(f)
	for s.Scan() {
		// ID PARENT MAJ:MIN ROOT MOUNTPOINT OPTIONS [OPTIONAL...] - FSTYPE SOURCE SUPER
		fields := strings.Fields(s.Text())
		sep := -1
		for i, x := range fields {
			if x == "-" {
				sep = i
				break
			}
		}
		if sep < 0 || sep+2 >= len(fields) || len(fields) < 5 {
			continue
		}
		source := fields[sep+2]
		if source == real || source == dev || partitionOf(source, real) {
			return fields[4], nil
		}
	}
	return "", s.Err()
}

// partitionOf: part is a partition device of disk (/dev/sda1 of /dev/sda,
// /dev/nvme0n1p2 of /dev/nvme0n1).
func partitionOf(part, disk string) bool {
	rest, ok := strings.CutPrefix(part, disk)
	if !ok || rest == "" {
		return false
	}
	rest = strings.TrimPrefix(rest, "p")
	return rest != "" && strings.Trim(rest, "0123456789") == ""
}

// copyImage writes size bytes of in to out, the ESP region replaced by
// esp, feeding h with every byte. A file target keeps its holes where the
// image has zeros (it was zero before); a device gets every byte.
func copyImage(ctx context.Context, out *os.File, in *os.File, esp []byte, espOff, size int64, sparse bool, h io.Writer, progress io.Writer) error {
	buf := make([]byte, 4<<20)
	zero := make([]byte, len(buf))
	last := time.Now()
	for off := int64(0); off < size; off += int64(len(buf)) {
		if err := ctx.Err(); err != nil {
			return err
		}
		n := int(min(int64(len(buf)), size-off))
		b := buf[:n]
		if _, err := in.ReadAt(b, off); err != nil && err != io.EOF {
			return err
		}
		// Overlay the ESP (with the parameters) on this chunk.
		if lo, hi := max(off, espOff), min(off+int64(n), espOff+int64(len(esp))); lo < hi {
			copy(b[lo-off:hi-off], esp[lo-espOff:hi-espOff])
		}
		h.Write(b)
		if !(sparse && bytes.Equal(b, zero[:n])) {
			if _, err := out.WriteAt(b, off); err != nil {
				return fmt.Errorf("writing at %s: %w", mib(off), err)
			}
		}
		if time.Since(last) > time.Second || off+int64(n) >= size {
			last = time.Now()
			fmt.Fprintf(progress, "  %s of %s (%.0f%%)\n", mib(off+int64(n)), mib(size), float64(off+int64(n))*100/float64(size))
		}
	}
	return nil
}
