//go:build built

package vmtest

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"plinth.dev/plinth/image"
	"plinth.dev/plinth/launch"
	"plinth.dev/plinth/platform/logtree"
)

// These tests boot the real node image built by `make image` (PLINTH_IMAGE
// overrides where it is), some also the next and the generic board's
// (ImageRef). They fail, never skip, when one is missing.

// mustImage loads the image r names or fails t.
func mustImage(t *testing.T, r launch.ImageRef) *launch.Image {
	t.Helper()
	img, err := r.Load()
	if err != nil {
		t.Fatal(err)
	}
	return img
}

// testImage is the default board's image, what most tests boot.
func testImage(t *testing.T) *launch.Image { return mustImage(t, launch.DefaultImage) }

// nextImage is the image `make image-next` built: the test image's
// binaries and board with another version, so another system image.
func nextImage(t *testing.T) *launch.Image { return mustImage(t, launch.NextImage) }

// genericImage is the generic-x86_64 board's image.
func genericImage(t *testing.T) *launch.Image {
	t.Helper()
	img := mustImage(t, launch.GenericImage)
	if img.Manifest.Board != "generic-x86_64" || img.Board.Name != img.Manifest.Board {
		t.Fatalf("%s holds an image for board %q", img.Dir, img.Manifest.Board)
	}
	return img
}

// bootTimeout is generous: TCG on a loaded 2-core CI machine is slow.
const bootTimeout = 3 * time.Minute

// haltedLine is what a node prints when a boot step failed and it waits.
const haltedLine = `E init: node halted`

// mustLine waits for a console line matching re. A node that halted can
// never print it, so that ends the wait at once unless re expects it.
func mustLine(t *testing.T, ctx context.Context, n *launch.Node, re string) []string {
	t.Helper()
	want := regexp.MustCompile(re)
	combined := regexp.MustCompile("(" + re + ")|(" + haltedLine + ".*)")
	m, err := n.WaitForLine(ctx, combined)
	if err != nil {
		t.Fatalf("waiting for %q: %v", re, err)
	}
	if m[1] == "" && !want.MatchString(m[len(m)-1]) {
		t.Fatalf("waiting for %q: the node halted instead: %s", re, m[len(m)-1])
	}
	return append([]string{m[1]}, m[2:2+want.NumSubexp()]...)
}

// nodeErrors returns the node's own error lines and kernel failures.
func nodeErrors(lines []string) []string {
	var bad []string
	for _, l := range lines {
		if e, ok := logtree.ParseLine(l); ok && e.Level.String() == "ERROR" {
			bad = append(bad, l)
		}
		for _, k := range []string{"Kernel panic", "BUG:", "Oops", "segfault", "panic:"} {
			if strings.Contains(l, k) {
				bad = append(bad, l)
			}
		}
	}
	return bad
}

func TestNodeBootsAndPowersOff(t *testing.T) {
	parallel(t, 17*time.Second) // single-machine tests run two at a time: see the package doc
	ctx, cancel := context.WithTimeout(context.Background(), bootTimeout)
	defer cancel()
	m := newMachine(t, launch.BootstrapParameters())
	img := m.img
	n := m.boot(t, ctx, "node")

	mustLine(t, ctx, n, `I init: node ready uptime=`)
	healthy := mustLine(t, ctx, n, `I init: all supervised runnables healthy runnables="?([^"]*)`)[1]
	for _, r := range []string{"root=HEALTHY", "root.network=HEALTHY", "root.power=HEALTHY"} {
		if !strings.Contains(healthy, r) {
			t.Errorf("healthy report %q lacks %s", healthy, r)
		}
	}
	mustLine(t, ctx, n, `I init: TPM device present devices=\S*/dev/tpm`)
	mustLine(t, ctx, n, `root filesystem: /dev/mapper/system squashfs read-only`)
	root := mustLine(t, ctx, n, `verity status V\), root hash ([0-9a-f]{64})`)[1]
	if root != img.Manifest.Verity.RootHash {
		t.Errorf("node verified root hash %s, image has %s", root, img.Manifest.Verity.RootHash)
	}
	mustLine(t, ctx, n, `cgroup2 detail="core in /sys/fs/cgroup/init`)
	mustLine(t, ctx, n, `I root.network: configured address interface=eth0 address=10\.0\.2\.15/24 gateway=10\.0\.2\.2`)

	cursor := len(n.Lines())
	if err := n.PowerDown(ctx); err != nil {
		t.Fatal(err)
	}
	if _, _, err := n.WaitForLineAfter(ctx, cursor, regexp.MustCompile(`I root.power: power button pressed`)); err != nil {
		t.Fatal(err)
	}
	if err := n.Wait(ctx); err != nil {
		t.Fatalf("qemu did not end cleanly: %v", err)
	}
	for _, re := range []string{`I init: all runnables stopped`, `I init: data volume unmounted`, `I init: filesystems synced, handing over to PID 1 action="power off"`, `I pid1: core finished, powering off`} {
		mustLine(t, ctx, n, re)
	}
	if bad := nodeErrors(n.Lines()); len(bad) > 0 {
		t.Errorf("errors on the console:\n%s", strings.Join(bad, "\n"))
	}
}

func TestCtrlAltDelReboots(t *testing.T) {
	parallel(t, 13*time.Second) // single-machine tests run two at a time: see the package doc
	ctx, cancel := context.WithTimeout(context.Background(), bootTimeout)
	defer cancel()
	n := newMachine(t, launch.BootstrapParameters()).boot(t, ctx, "node")
	mustLine(t, ctx, n, `I init: node ready`)
	if err := n.CtrlAltDel(ctx); err != nil {
		t.Fatal(err)
	}
	// QEMU runs with -no-reboot: a reboot ends the process with status 0.
	if err := n.Wait(ctx); err != nil {
		t.Fatalf("qemu did not end cleanly: %v", err)
	}
	mustLine(t, ctx, n, `I init: shutdown requested signal=interrupt`)
	mustLine(t, ctx, n, `I init: all runnables stopped`)
	mustLine(t, ctx, n, `I pid1: core finished, rebooting`)
	if bad := nodeErrors(n.Lines()); len(bad) > 0 {
		t.Errorf("errors on the console:\n%s", strings.Join(bad, "\n"))
	}
}

// TestTamperedSystemImageRefused flips one byte in the middle of the system
// image inside a copy of the initramfs. The node mounts the image at once
// (dm-verity refuses a bad block to any reader) and reads all of it in the
// background: that read must find the flipped block, and the node must
// say so, stop everything it runs, close its data volume and halt — not
// panic or loop — and still power off on request.
func TestTamperedSystemImageRefused(t *testing.T) {
	parallel(t, 14*time.Second) // single-machine tests run two at a time: see the package doc
	ctx, cancel := context.WithTimeout(context.Background(), bootTimeout)
	defer cancel()
	m := newMachine(t, launch.BootstrapParameters())
	orig := filepath.Join(m.img.Dir, image.InitramfsFile)
	data, err := os.ReadFile(orig)
	if err != nil {
		t.Fatal(err)
	}
	off, size, err := image.SystemImageExtent(orig)
	if err != nil {
		t.Fatal(err)
	}
	data[off+size/2] ^= 0x01
	// The middle of the image is data (the hash tree is the last ~1 %).
	if size/2 >= int64(m.img.Manifest.Verity.DataBlocks)*4096 {
		t.Fatalf("the middle of the system image (%d) is not data", size/2)
	}
	wantBlock := fmt.Sprint(size / 2 / 4096)
	tampered := filepath.Join(m.dir, "initramfs-tampered.img")
	if err := os.WriteFile(tampered, data, 0o644); err != nil {
		t.Fatal(err)
	}
	n := m.boot(t, ctx, "node", func(o *launch.NodeOptions) { o.Initramfs, o.NoNetwork = tampered, true })

	// The boot does not wait for the full read; the full read finds the
	// very block that was changed.
	mustLine(t, ctx, n, `I init: verify the whole system image in the background`)
	bad := mustLine(t, ctx, n, `E init: system image verification failed err=".*does not match the root hash.*: reading block (\d+) `)
	if bad[1] != wantBlock {
		t.Errorf("verification failed at block %s, the tampered byte is in block %s", bad[1], wantBlock)
	}
	_, halted, err := n.WaitForLineAfter(ctx, 0, regexp.MustCompile(`E init: node halted: the system image does not match its root hash`))
	if err != nil {
		t.Fatal(err)
	}
	// Halted means stopped: every runnable and the data volume, if the
	// boot had got that far; then only the power button is served.
	lines := n.Lines()
	joined := strings.Join(lines[:halted], "\n")
	if strings.Contains(joined, "boot step failed") {
		t.Errorf("a boot step failed before the verification did:\n%s", joined)
	}
	if strings.Contains(joined, "I root.") && !strings.Contains(joined, "I init: all runnables stopped") {
		t.Errorf("the supervisor tree ran and was not stopped before the halt")
	}
	if strings.Contains(joined, "boot counter") && !strings.Contains(joined, "I init: data volume unmounted") {
		t.Errorf("the data volume was open and not closed before the halt")
	}
	if _, _, err := n.WaitForLineAfter(ctx, halted, regexp.MustCompile(`listening for the power button`)); err != nil {
		t.Fatal(err)
	}
	if err := n.PowerDown(ctx); err != nil {
		t.Fatal(err)
	}
	if err := n.Wait(ctx); err != nil {
		t.Fatalf("qemu did not end cleanly: %v", err)
	}
	for _, l := range n.Lines()[halted:] {
		for _, bad := range []string{"node ready", "Kernel panic", "core died", "I root.network", "I root.roleserver"} {
			if strings.Contains(l, bad) {
				t.Errorf("tampered node went on after halting: %q", l)
			}
		}
	}
	if _, err := n.WaitForLine(ctx, regexp.MustCompile(`I pid1: core finished, powering off`)); err != nil {
		t.Fatal(err)
	}
}
