//go:build built

package vmtest

import (
	"context"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"plinth.dev/plinth/launch"
)

// Which disk is the data disk, with more than one attached. The guest
// names virtio disks in attachment order (vda, vdb, ...), so attaching a
// blank disk first is what an asynchronous probe that finished early
// would look like.

// scratchDiskSize keeps the extra disks small: they are only ever read
// back to check that they are still all zero.
const scratchDiskSize = 256 << 20

// openDataDiskLine waits for the result of the boot step "open data disk"
// and returns whether it failed and its detail or error.
func openDataDiskLine(t *testing.T, ctx context.Context, n *launch.Node) (failed bool, text string) {
	t.Helper()
	m := mustLine(t, ctx, n, `init: (boot step failed: )?open data disk (?:detail|err)=(.*)`)
	return m[1] != "", m[2]
}

// TestDataDiskStaysWithItsNode: a node set up on one disk boots again with
// a blank disk attached in front of it (so the blank one is vda): it opens
// its own disk and never writes the blank one.
func TestDataDiskStaysWithItsNode(t *testing.T) {
	parallel(t, 18*time.Second) // single-machine tests run two at a time: see the package doc
	ctx, cancel := context.WithTimeout(context.Background(), 2*bootTimeout)
	defer cancel()
	m := newMachine(t, launch.BootstrapParameters())
	n := m.boot(t, ctx, "boot1")
	if failed, text := openDataDiskLine(t, ctx, n); failed || !strings.Contains(text, "initialised /dev/vda") {
		t.Fatalf("want vda set up; got %s", text)
	}
	wantBootCount(t, ctx, n, "1")
	powerOff(t, ctx, n)

	blank := filepath.Join(m.dir, "blank.img")
	n = m.boot(t, ctx, "boot2-blank-disk-first", func(o *launch.NodeOptions) {
		o.Disks = []launch.Disk{{Path: o.DiskPath}}
		o.DiskPath, o.DiskSizeBytes = blank, scratchDiskSize
	})
	if failed, text := openDataDiskLine(t, ctx, n); failed || !strings.Contains(text, "unlocked /dev/vdb") {
		t.Fatalf("want its own disk, vdb, unlocked; got %s", text)
	}
	wantBootCount(t, ctx, n, "2")
	mustLine(t, ctx, n, `I init: storage: data disk chosen disk="vdb .*Plinth data partition`)
	assertNoLine(t, n, `make ext4 filesystem`)
	powerOff(t, ctx, n)
	if !diskZero(t, blank) {
		t.Fatal("the blank disk attached first was written")
	}
}

// TestTwoBlankDisksNeedDataDisk: a fresh node with two blank disks and no
// storage.data_disk cannot know which to set up: it says so, naming the
// disks and the parameter, and writes neither.
func TestTwoBlankDisksNeedDataDisk(t *testing.T) {
	parallel(t, 12*time.Second) // single-machine tests run two at a time: see the package doc
	ctx, cancel := context.WithTimeout(context.Background(), bootTimeout)
	defer cancel()
	m := newMachine(t, launch.BootstrapParameters())
	second := filepath.Join(m.dir, "second.img")
	n := m.boot(t, ctx, "boot", func(o *launch.NodeOptions) {
		o.Disks = []launch.Disk{{Path: second, SizeBytes: scratchDiskSize}}
	})
	failed, text := openDataDiskLine(t, ctx, n)
	if !failed || !strings.Contains(text, "cannot choose the data disk: more than one disk qualifies: 2 disks and none carries a Plinth data partition") {
		t.Fatalf("want a refusal to choose; got %s", text)
	}
	t.Logf("refused as expected: %s", text)
	for _, want := range []string{"vda (", "vdb (", "set storage.data_disk"} {
		if !strings.Contains(text, want) {
			t.Errorf("the error does not name %q: %s", want, text)
		}
	}
	mustLine(t, ctx, n, haltedLine)
	powerOff(t, ctx, n)
	for _, d := range []string{m.disk, second} {
		if !diskZero(t, d) {
			t.Errorf("%s was written", d)
		}
	}
}

// TestDataDiskNamedBySerial: the same two blank disks, with
// storage.data_disk naming the second by its serial: that one is set up,
// the other stays zero.
func TestDataDiskNamedBySerial(t *testing.T) {
	parallel(t, 11*time.Second) // single-machine tests run two at a time: see the package doc
	ctx, cancel := context.WithTimeout(context.Background(), bootTimeout)
	defer cancel()
	p := launch.BootstrapParameters()
	p.Storage.DataDisk = "plinth-data-2"
	m := newMachine(t, p)
	second := filepath.Join(m.dir, "second.img")
	n := m.boot(t, ctx, "boot", func(o *launch.NodeOptions) {
		o.Disks = []launch.Disk{{Path: second, SizeBytes: scratchDiskSize, Serial: "plinth-data-2"}}
	})
	if failed, text := openDataDiskLine(t, ctx, n); failed || !strings.Contains(text, "initialised /dev/vdb") {
		t.Fatalf("want the named disk, vdb, set up; got %s", text)
	}
	mustLine(t, ctx, n, `I init: storage: data disk chosen disk="vdb \(.*serial plinth-data-2, blank\)" why="storage.data_disk names it`)
	wantBootCount(t, ctx, n, "1")
	powerOff(t, ctx, n)
	if !diskZero(t, m.disk) {
		t.Error("the disk storage.data_disk does not name was written")
	}
	if diskZero(t, second) {
		t.Error("the named disk was not set up")
	}
}
