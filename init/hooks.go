package main

// Hooks for test and benchmark images, on the (measured) kernel command
// line: a node image never carries them, so none changes what a node's
// boot does. They are kept here, apart from the boot steps, so that the
// steps read as the boot every node runs.

import (
	"fmt"
	"log/slog"
	"os"
	"time"

	"golang.org/x/sys/unix"

	"plinth.dev/plinth/platform/blockdev"
	datadisk "plinth.dev/plinth/platform/storage"
)

// haltArg stops the boot before the data disk is opened: for images that
// must not join a cluster (a debugging image; the update test's image
// that fails its trial boot). "hang" stops the core process instead of
// failing the step.
const haltArg = "plinth.halt"

// benchArg=storage (set by `make bench`) runs the storage benchmark after
// the boot steps.
const benchArg = "plinth.bench"

// haltBeforeDataDisk fails the "open data disk" step, or hangs the core,
// as haltArg asks; nil without it.
func (b *boot) haltBeforeDataDisk() error {
	v, ok := b.args[haltArg]
	if !ok {
		return nil
	}
	if v == "hang" {
		// A hang, as a test image needs one: the whole core stops (PID 1
		// keeps waiting for it).
		b.l.Error(haltArg + "=hang on the kernel command line: the core stops here")
		b.logs.Flush(3 * time.Second)
		unix.Kill(os.Getpid(), unix.SIGSTOP)
		// The stop reaches every thread, this one included, only when
		// each is next interrupted (under TCG that took long enough for
		// this step to fail and the trial to reboot by itself): wait for
		// it here.
		for {
			time.Sleep(time.Hour)
		}
	}
	return fmt.Errorf("%s=%s on the kernel command line: the image stops before it opens the data disk", haltArg, v)
}

// benchmark runs the storage benchmark if benchArg asks for it.
func (b *boot) benchmark() {
	if b.args[benchArg] == "storage" {
		benchmarkStorage(b.l, b.disk.Disk)
	}
}

// benchmarkStorage runs only when the kernel command line asks for it
// (plinth.bench=storage, set by `make bench`): it measures dm-crypt
// against the raw disk on a second disk, which the benchmark provides as
// scratch space, and never on the data disk.
func benchmarkStorage(l *slog.Logger, dataDisk string) {
	disks, err := blockdev.Disks()
	var scratch string
	for _, d := range disks {
		if d.Path != dataDisk && scratch == "" {
			scratch = d.Path
		}
	}
	if err != nil || scratch == "" || dataDisk == "" {
		l.Error("storage benchmark needs a second (scratch) disk besides the data disk", "err", err)
		return
	}
	const size = 128 << 20
	r, err := datadisk.BenchmarkCrypt(scratch, size)
	if err != nil {
		l.Error("storage benchmark", "err", err)
		return
	}
	l.Info("storage benchmark", "disk", scratch, "bytes", size,
		"raw_write_mbps", fmt.Sprintf("%.1f", r.Raw.WriteMBps), "raw_read_mbps", fmt.Sprintf("%.1f", r.Raw.ReadMBps),
		"crypt_write_mbps", fmt.Sprintf("%.1f", r.Crypt.WriteMBps), "crypt_read_mbps", fmt.Sprintf("%.1f", r.Crypt.ReadMBps))
}
