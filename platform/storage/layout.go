package storage

import (
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"

	"plinth.dev/plinth/platform/blockdev"
	"plinth.dev/plinth/platform/gpt"
)

// Finding the data partition on the data disk and reading its header.
//
// A partition is named by its GPT entry number, never by its position
// among the used entries: in a table whose entries 1, 3 and 4 are used,
// the fourth entry is the kernel's vda4, and there is no vda2. Flashed
// disks (ESP, system slots, data) make such gaps common, and opening the
// wrong number could set up — format — someone else's partition. So the
// partition is checked three times before anything reads or writes it:
//
//  1. its number is its entry number (gpt.Partition.Number);
//  2. the kernel's device of that number is that entry: sysfs lists it
//     under the disk with the entry's number, start and size, and the
//     device node is that sysfs device (checkPartitionDevice) — a stale
//     kernel view of the table is refused;
//  3. a header found on it belongs to the entry's partition GUID.
//
// The third check alone cannot help where it matters most, on a partition
// whose start is zero (which would be set up), hence the second.

// sysBlock lists the kernel's block devices; a disk's partitions are
// subdirectories of its directory.
const sysBlock = "/sys/block"

// readLayout returns the header of the data partition, nil for a blank
// disk or a partition whose setup never began. It refuses anything it
// does not understand.
func (o *opener) readLayout() (*Header, error) {
	o.res.Disk = o.disk.Path
	f, err := os.Open(o.disk.Path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	t, err := gpt.Read(f, o.disk.Size)
	if errors.Is(err, gpt.ErrNoTable) {
		blank, berr := DiskIsBlank(f, o.disk.Size)
		if berr != nil {
			return nil, berr
		}
		if !blank {
			return nil, fmt.Errorf("%w: %s has data but no GPT; wipe it explicitly to use it for Plinth", ErrRefused, o.disk.Path)
		}
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("%w: %s: %v", ErrRefused, o.disk.Path, err)
	}
	part, n, ok := findPartition(t)
	if !ok && isFlashed(t) {
		// Flashed, first boot: the data partition is added in setup.
		o.flashed = t
		return nil, nil
	}
	if !ok {
		if all := t.FindAll(DataPartitionType); len(all) > 1 {
			return nil, fmt.Errorf("%w: %s has %d Plinth data partitions; refusing to choose one", ErrRefused, o.disk.Path, len(all))
		}
		return nil, fmt.Errorf("%w: %s has a partition table without a Plinth data partition", ErrRefused, o.disk.Path)
	}
	o.part = part
	o.res.Partition = blockdev.PartitionPath(o.disk.Path, n)
	if _, err := os.Stat(o.res.Partition); err != nil {
		if err := blockdev.RereadPartitions(o.disk.Path, n); err != nil {
			return nil, err
		}
	}
	if err := checkPartitionDevice(sysBlock, filepath.Base(o.disk.Path), o.res.Partition, part); err != nil {
		return nil, err
	}
	pf, err := os.Open(o.res.Partition)
	if err != nil {
		return nil, err
	}
	defer pf.Close()
	return readPartitionHeader(pf, part, o.res.Partition, o.Log)
}

// findPartition returns the table's Plinth data partition and its number,
// which is its 1-based GPT entry index and so the kernel's partition
// number (entry 4 is vda4, whatever entries before it are empty). ok is
// false unless there is exactly one.
func findPartition(t *gpt.Table) (gpt.Partition, int, bool) {
	all := t.FindAll(DataPartitionType)
	if len(all) != 1 || all[0].Number < 1 {
		return gpt.Partition{}, 0, false
	}
	return all[0], all[0].Number, true
}

// checkPartitionDevice checks that dev, the device node of partition
// p.Number of disk, is GPT entry p as the kernel sees it. It refuses
// (ErrRefused) when the kernel's partition of that number starts or ends
// elsewhere or has another number, which is what a stale view of the
// table looks like.
func checkPartitionDevice(sys, disk, dev string, p gpt.Partition) error {
	majMin, err := blockdev.MajorMinor(dev)
	if err != nil {
		return err
	}
	return checkPartitionSysfs(filepath.Join(sys, disk, filepath.Base(dev)), majMin, p)
}

// checkPartitionSysfs compares the sysfs directory of a partition (its
// "partition", "start", "size" in 512-byte sectors, and "dev") with GPT
// entry p and the device number majMin of the node about to be opened.
func checkPartitionSysfs(dir, majMin string, p gpt.Partition) error {
	name := filepath.Base(dir)
	for _, c := range []struct{ file, want string }{
		{"partition", strconv.Itoa(p.Number)},
		{"start", strconv.FormatUint(p.FirstLBA, 10)},
		{"size", strconv.FormatUint(p.LastLBA-p.FirstLBA+1, 10)},
		{"dev", majMin},
	} {
		b, err := os.ReadFile(filepath.Join(dir, c.file))
		if err != nil {
			return fmt.Errorf("%w: the kernel lists no partition %s of this disk for GPT entry %d: %v", ErrRefused, name, p.Number, err)
		}
		if got := strings.TrimSpace(string(b)); got != c.want {
			return fmt.Errorf("%w: the kernel's %s is not GPT entry %d (%s %s, the entry says %s); its view of the partition table is stale",
				ErrRefused, name, p.Number, c.file, got, c.want)
		}
	}
	return nil
}

// readPartitionHeader reads the header at the start of r, the device of
// data partition part (named name in errors): nil when setup never began
// (a zero header region, or the intent marker of a cut first write). A
// damaged header, foreign data or a header of another partition is
// refused.
func readPartitionHeader(r io.ReaderAt, part gpt.Partition, name string, log *slog.Logger) (*Header, error) {
	h, report, err := ReadHeader(r, 0)
	switch {
	case errors.Is(err, ErrHeaderIncomplete):
		log.Warn("storage: the first header write of an earlier setup was interrupted; setting the disk up again")
		return nil, nil
	case errors.Is(err, ErrNoHeader):
		return nil, nil
	case err != nil:
		return nil, fmt.Errorf("%w: data partition %s: %v", ErrRefused, name, err)
	}
	if h.PartitionID != part.ID {
		return nil, fmt.Errorf("%w: header of %s belongs to partition %s, not %s (GPT entry %d)", ErrRefused, name, h.PartitionID, part.ID, part.Number)
	}
	if report.Degraded() {
		log.Warn("storage: one copy of the data header is damaged; the other is used and rewritten at the next update")
	}
	return h, nil
}

// errNoDisk: a caller did not say which disk; the data disk is chosen
// once per boot (FindDataDisk) and every later call names it.
var errNoDisk = errors.New("storage: no data disk given (Config.Disk is empty); choose it with FindDataDisk")

// Peek reads the data partition's header on disk without changing
// anything: nil for a blank disk or one whose setup never began.
func Peek(disk string) (*Header, error) {
	o := &opener{Config: Config{Disk: disk, Log: slog.New(slog.DiscardHandler)}, res: &Result{}}
	if err := o.findDisk(); err != nil {
		return nil, err
	}
	return o.readLayout()
}

// UpdateEnrolment replaces the enrolment blob in the header of disk,
// which must be set up (e.g. when the cluster's curators moved). The
// header is rewritten with the two-slot protocol, so a power cut keeps one
// copy.
func UpdateEnrolment(disk string, enrolment []byte) error {
	return updateHeader(disk, func(h *Header) error {
		h.Enrolment = enrolment
		return nil
	})
}

// headerMu serialises the read-modify-write of a set-up header
// (UpdateEnrolment, ResealNodeKey), which enrolment and an update may do
// at the same time.
var headerMu sync.Mutex

func updateHeader(disk string, change func(h *Header) error) error {
	headerMu.Lock()
	defer headerMu.Unlock()
	o := &opener{Config: Config{Disk: disk, Log: slog.New(slog.DiscardHandler)}, res: &Result{}}
	if err := o.findDisk(); err != nil {
		return err
	}
	h, err := o.readLayout()
	if err != nil {
		return err
	}
	if h == nil || h.State != StateReady {
		return fmt.Errorf("%w: the data disk is not set up", ErrRefused)
	}
	if err := change(h); err != nil {
		return err
	}
	return o.writeHeader(h)
}

// ResealNodeKey seals the node unlock key of the volume r opened again
// with keys (which may seal to more than this boot's PCRs: an update) and
// writes it to the header, with the two-slot protocol.
func (r *Result) ResealNodeKey(keys KeyProtector) error {
	if r == nil || r.nuk == nil {
		return errors.New("storage: no node unlock key kept this boot (the volume was not opened by this process)")
	}
	return updateHeader(r.Disk, func(h *Header) error {
		if h.KeyPolicy != keys.Policy() && h.KeyPolicy != keys.Policy()+"+cluster" {
			return fmt.Errorf("%w: the header's key policy %q is not %q", ErrRefused, h.KeyPolicy, keys.Policy())
		}
		blob, err := keys.Seal(r.nuk)
		if err != nil {
			return err
		}
		h.SealedKey = blob
		return nil
	})
}

// SealedKey returns the sealed node unlock key in the header of disk.
func SealedKey(disk string) ([]byte, error) {
	h, err := Peek(disk)
	if err != nil {
		return nil, err
	}
	if h == nil {
		return nil, fmt.Errorf("%w: the data disk is not set up", ErrRefused)
	}
	return h.SealedKey, nil
}
