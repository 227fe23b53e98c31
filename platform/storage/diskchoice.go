package storage

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"strings"
	"time"

	"plinth.dev/plinth/platform/blockdev"
	"plinth.dev/plinth/platform/gpt"
	"plinth.dev/plinth/platform/layout"
)

// Choosing the data disk.
//
// Which disk is the data disk must not depend on which driver finished
// probing first: a bootstrap node that took a blank second disk because it
// happened to be probed first would found a second cluster on it. So the
// choice is a pure function (ChooseDataDisk) of the disks present once
// probing has settled and of the node parameters' storage.data_disk, made
// once per boot (FindDataDisk); every later use gets the result in
// Config.Disk.
//
//	disks with a Plinth      storage.data_disk        → data disk
//	data partition
//	──────────────────────────────────────────────────────────────────────
//	exactly one              empty                    that disk
//	two or more              empty                    error: name one
//	none                     empty                    the flashed Plinth disk (ESP
//	                                                  and system slots), if there
//	                                                  is exactly one; else the
//	                                                  only disk, if there is
//	                                                  exactly one disk and it is
//	                                                  blank; otherwise an error
//	any                      names one of them        that disk
//	none                     names a blank or         that disk
//	                         flashed disk
//	some other disk          names a blank disk       error: contradiction
//	—                        names a disk that is     error
//	                         neither blank nor ours
//	—                        names no disk, or two    error
//
// A disk that is neither blank (DiskIsBlank, no partition table) nor
// carries a Plinth data partition is never a candidate and never written.
// Every error wraps ErrDataDiskChoice, and nothing has been written when
// one is returned.

// ErrDataDiskChoice wraps every reason the node cannot tell which disk is
// its data disk.
var ErrDataDiskChoice = errors.New("cannot choose the data disk")

var (
	// ErrNoDataDisk: no disk qualifies.
	ErrNoDataDisk = fmt.Errorf("%w: no disk qualifies", ErrDataDiskChoice)
	// ErrDataDiskNotFound: storage.data_disk names no disk present (an
	// ErrNoDataDisk). FindDataDisk waits for it until its timeout.
	ErrDataDiskNotFound = fmt.Errorf("%w: storage.data_disk names no disk present", ErrNoDataDisk)
	// ErrDataDiskAmbiguous: more than one disk qualifies and the node
	// parameters do not say which.
	ErrDataDiskAmbiguous = fmt.Errorf("%w: more than one disk qualifies", ErrDataDiskChoice)
	// ErrDataDiskConflict: storage.data_disk names a blank disk while
	// another disk already carries a Plinth data partition.
	ErrDataDiskConflict = fmt.Errorf("%w: storage.data_disk contradicts the disks", ErrDataDiskChoice)
)

// DataDiskParameter is the node parameter that names the data disk.
const DataDiskParameter = "storage.data_disk"

// DiskInfo describes one disk for ChooseDataDisk.
type DiskInfo struct {
	Name   string // kernel name: "vda"
	Path   string // device node: "/dev/vda"
	Serial string // as the kernel reports it; "" if it reports none
	Size   int64
	// Blank: no partition table and the first and last MiB are zero.
	Blank bool
	// Plinth: a GPT with at least one Plinth data partition.
	Plinth bool
	// Flashed: a flashed Plinth disk (disk.img: ESP and system slots) with
	// no data partition yet; the node adds it in the free space.
	Flashed bool
	// Note says what a disk that is neither holds, for messages.
	Note string
}

func (d DiskInfo) String() string {
	var what []string
	what = append(what, humanSize(d.Size))
	if d.Serial != "" {
		what = append(what, "serial "+d.Serial)
	}
	switch {
	case d.Plinth:
		what = append(what, "Plinth data partition")
	case d.Flashed:
		what = append(what, "flashed Plinth disk, no data partition yet")
	case d.Blank:
		what = append(what, "blank")
	case d.Note != "":
		what = append(what, d.Note)
	}
	return d.Name + " (" + strings.Join(what, ", ") + ")"
}

func diskList(ds []DiskInfo) string {
	s := make([]string, len(ds))
	for i, d := range ds {
		s[i] = d.String()
	}
	return strings.Join(s, ", ")
}

// ChooseDataDisk picks the data disk among disks (see the table above);
// want is storage.data_disk: a kernel name or a serial, or "".
func ChooseDataDisk(disks []DiskInfo, want string) (DiskInfo, error) {
	var ours []DiskInfo
	for _, d := range disks {
		if d.Plinth {
			ours = append(ours, d)
		}
	}
	if want != "" {
		var named []DiskInfo
		for _, d := range disks {
			if d.Name == want || d.Serial != "" && d.Serial == want {
				named = append(named, d)
			}
		}
		switch {
		case len(named) == 0:
			return DiskInfo{}, fmt.Errorf("%w: %q is neither the kernel name nor the serial of a disk here (disks: %s)", ErrDataDiskNotFound, want, diskList(disks))
		case len(named) > 1:
			return DiskInfo{}, fmt.Errorf("%w: %s %q matches %s; name the disk by its serial", ErrDataDiskAmbiguous, DataDiskParameter, want, diskList(named))
		}
		d := named[0]
		switch {
		case d.Plinth:
			return d, nil
		case !d.Blank && !d.Flashed:
			return DiskInfo{}, fmt.Errorf("%w: %s, named by %s, is neither blank nor a Plinth disk; wipe it explicitly to use it", ErrNoDataDisk, d, DataDiskParameter)
		case len(ours) > 0:
			return DiskInfo{}, fmt.Errorf("%w: it names the blank disk %s, but %s already carries a Plinth data partition; name that disk, or wipe it", ErrDataDiskConflict, d, diskList(ours))
		}
		return d, nil
	}
	switch {
	case len(ours) == 1:
		return ours[0], nil
	case len(ours) > 1:
		return DiskInfo{}, fmt.Errorf("%w: %s each carry a Plinth data partition; set %s in the node parameters to the kernel name or serial of the one to use", ErrDataDiskAmbiguous, diskList(ours), DataDiskParameter)
	}
	var flashed []DiskInfo
	for _, d := range disks {
		if d.Flashed {
			flashed = append(flashed, d)
		}
	}
	switch {
	case len(flashed) == 1:
		return flashed[0], nil
	case len(flashed) > 1:
		return DiskInfo{}, fmt.Errorf("%w: %s are flashed Plinth disks; set %s in the node parameters to the kernel name or serial of the one to keep the data on", ErrDataDiskAmbiguous, diskList(flashed), DataDiskParameter)
	case len(disks) == 0:
		return DiskInfo{}, fmt.Errorf("%w: no disk found", ErrNoDataDisk)
	case len(disks) == 1 && disks[0].Blank:
		return disks[0], nil
	case len(disks) == 1:
		return DiskInfo{}, fmt.Errorf("%w: the only disk, %s, is neither blank nor a Plinth data disk; wipe it explicitly to use it", ErrNoDataDisk, disks[0])
	}
	for _, d := range disks {
		if d.Blank {
			return DiskInfo{}, fmt.Errorf("%w: %d disks and none carries a Plinth data partition: %s; set %s in the node parameters to the kernel name or serial of the disk to set up",
				ErrDataDiskAmbiguous, len(disks), diskList(disks), DataDiskParameter)
		}
	}
	return DiskInfo{}, fmt.Errorf("%w: no disk is blank or carries a Plinth data partition: %s", ErrNoDataDisk, diskList(disks))
}

// describeContent says whether a disk of size bytes is blank, carries a
// Plinth data partition or is a flashed Plinth disk, and otherwise what
// it holds (in the Blank, Plinth, Flashed and Note fields). Only an I/O
// error is an error.
func describeContent(r io.ReaderAt, size int64) (DiskInfo, error) {
	t, err := gpt.Read(r, size)
	switch {
	case errors.Is(err, gpt.ErrNoTable):
		blank, err := DiskIsBlank(r, size)
		if err != nil {
			return DiskInfo{}, err
		}
		if blank {
			return DiskInfo{Blank: true}, nil
		}
		return DiskInfo{Note: "data but no GPT"}, nil
	case errors.Is(err, gpt.ErrCorrupt) || errors.Is(err, gpt.ErrNoProtectiveMBR):
		return DiskInfo{Note: strings.TrimPrefix(err.Error(), "gpt: ")}, nil
	case err != nil:
		return DiskInfo{}, err
	}
	if len(t.FindAll(DataPartitionType)) > 0 {
		return DiskInfo{Plinth: true}, nil
	}
	if isFlashed(t) {
		return DiskInfo{Flashed: true}, nil
	}
	return DiskInfo{Note: fmt.Sprintf("GPT with %d partitions, none a Plinth data partition", len(t.Partitions))}, nil
}

// systemSlotType is the GPT type of the flashed disk's system slots.
var systemSlotType = gpt.MustParseGUID(layout.SystemSlotType)

// isFlashed: t is a flashed Plinth disk's table (system slots, no data
// partition yet), whose free space is meant for the data partition.
func isFlashed(t *gpt.Table) bool {
	return len(t.FindAll(DataPartitionType)) == 0 && len(t.FindAll(systemSlotType)) > 0
}

// ScanDisks describes every disk the kernel lists (blockdev.Disks). A disk
// that cannot be read is listed as neither blank nor ours.
func ScanDisks() ([]DiskInfo, error) {
	disks, err := blockdev.Disks()
	if err != nil {
		return nil, err
	}
	out := make([]DiskInfo, 0, len(disks))
	for _, d := range disks {
		var info DiskInfo
		f, err := os.Open(d.Path)
		if err == nil {
			info, err = describeContent(f, d.Size)
			f.Close()
		}
		info.Name, info.Path, info.Serial, info.Size = d.Name, d.Path, d.Serial, d.Size
		if err != nil {
			info.Note = "unreadable: " + err.Error()
		}
		out = append(out, info)
	}
	return out, nil
}

// Disk probing: drivers probe asynchronously after their module loaded,
// so a disk may appear a little after another. A disk carrying a Plinth
// data partition (and matching storage.data_disk, if set) is taken at
// once; any other decision waits until the set of disks has not changed
// for diskSettle, and for a named or any disk to appear at all up to
// diskTimeout.
const (
	diskSettle   = time.Second
	diskTimeout  = 10 * time.Second
	diskInterval = 100 * time.Millisecond
)

// FindDataDisk waits for the disks to settle and chooses the data disk;
// want is storage.data_disk. It says on log what it waits for and what it
// chose, and why.
func FindDataDisk(ctx context.Context, want string, log *slog.Logger) (DiskInfo, error) {
	d, err := waitForDataDisk(ctx, ScanDisks, want, log, diskSettle, diskTimeout, diskInterval)
	if errors.Is(err, ErrDataDiskChoice) {
		err = fmt.Errorf("%w (nothing was written to any disk)", err)
	}
	return d, err
}

func waitForDataDisk(ctx context.Context, scan func() ([]DiskInfo, error), want string, log *slog.Logger, settle, timeout, interval time.Duration) (DiskInfo, error) {
	start := time.Now()
	var (
		key         string
		stableSince time.Time
		waitingFor  string
	)
	for {
		disks, err := scan()
		if err != nil {
			return DiskInfo{}, err
		}
		now := time.Now()
		if k := disksKey(disks); k != key || stableSince.IsZero() {
			key, stableSince = k, now
		}
		d, err := ChooseDataDisk(disks, want)
		stable := now.Sub(stableSince) >= settle
		// A missing disk may still be probing: wait for it to the end.
		missing := len(disks) == 0 || errors.Is(err, ErrDataDiskNotFound)
		timedOut := now.Sub(start) >= timeout
		switch {
		case err == nil && d.Plinth:
			log.Info("storage: data disk chosen", "disk", d.String(), "why", "it carries a Plinth data partition")
			return d, nil
		case timedOut && !stable && !missing:
			return DiskInfo{}, fmt.Errorf("%w: disks were still appearing after %v: %s", ErrDataDiskChoice, timeout, diskList(disks))
		case timedOut || stable && !missing:
			if err != nil {
				return DiskInfo{}, err
			}
			why := "it is the only disk, and blank"
			switch {
			case want != "":
				why = DataDiskParameter + " names it, and it is blank or flashed"
			case d.Flashed:
				why = "it is the only flashed Plinth disk: the data partition goes into its free space"
			}
			log.Info("storage: data disk chosen", "disk", d.String(), "why", why)
			return d, nil
		}
		what := "disk probing to settle before deciding that no disk carries a Plinth data partition"
		switch {
		case len(disks) == 0:
			what = "a disk to appear"
		case missing:
			what = fmt.Sprintf("the disk %s names (%q) to appear", DataDiskParameter, want)
		}
		if what != waitingFor {
			waitingFor = what
			log.Info("storage: waiting for "+what, "disks", diskList(disks), "at_most", timeout)
		}
		select {
		case <-ctx.Done():
			return DiskInfo{}, ctx.Err()
		case <-time.After(interval):
		}
	}
}

// disksKey identifies the set of disks, to tell when probing has settled.
func disksKey(ds []DiskInfo) string {
	var b strings.Builder
	for _, d := range ds {
		fmt.Fprintf(&b, "%s:%d:%s:%t:%t:%t;", d.Name, d.Size, d.Serial, d.Blank, d.Plinth, d.Flashed)
	}
	return b.String()
}
