//go:build built

package vmtest

import (
	"bytes"
	"context"
	"crypto/ed25519"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"plinth.dev/plinth/api/clusterpb"
	"plinth.dev/plinth/image"
	"plinth.dev/plinth/launch"
	"plinth.dev/plinth/platform/pki"
	"plinth.dev/plinth/roleserver/owner"
)

// TestUpdate: a node booted from its flashed disk (OVMF + swtpm) refuses
// an image for another board, and comes back on its slot after a power
// cut while it writes the new one (the update reported as interrupted).
// Y staged (`-stage`: written, checked, sealed for, not booted) stays
// staged across a power cut (slot a boots as before), refuses a second
// update and is cancelled (`-cancel`). Y without its manifest.sig, and
// Y with a signature of a key the cluster does not trust, are refused by
// the node before anything is sent, slot b and the status untouched. The
// node is then updated
// with `plinthctl node update` from version X to Y: Y's UKI is written (slot b
// holds Y's system image since the staged update) and the node's keys
// sealed to b's predicted PCRs as well, the
// node boots b once (BootNext), unseals, rejoins and confirms: it runs Y
// from slot b, HEALTHY, its boot count and the cluster's data kept, the
// live PCRs equal to the predictions. Then an update to an image that
// hangs before the cluster (its UKI stops the core) makes the trial boot
// fail: the watchdog resets the machine, the node is back on Y in slot b
// by itself, HEALTHY, with the
// failed update in its status, and the old slot's seal dropped again. Slot
// a still held that image's system image, so only its UKI was sent.
func TestUpdate(t *testing.T) {
	// One machine (a one-node cluster): runs beside the other
	// single-machine tests (see doc.go).
	parallel(t, 189*time.Second)
	ctx, cancel := context.WithTimeout(context.Background(), 25*time.Minute)
	defer cancel()
	x, y := testImage(t), nextImage(t)
	if x.Manifest.Version == y.Manifest.Version || x.Manifest.Verity.RootHash == y.Manifest.Verity.RootHash {
		t.Fatalf("the next image is not another version: %s and %s", x.Manifest.Version, y.Manifest.Version)
	}
	dir := testDir(t)
	c, err := launch.LaunchCluster(ctx, launch.ClusterOptions{Nodes: 1, Image: x, Dir: dir, DiskSizeBytes: 2 << 30, Progress: logWriter{t}, DiskBoot: true})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	n := c.Nodes()[0]
	ticket, err := c.Client().Ticket(ctx)
	if err != nil {
		t.Fatal(err)
	}
	ctl := buildPlinthctl(t)
	// Set by one step, used by a later one.
	var k2 releaseKey

	step(t, "other-board-refused", func(t *testing.T) {
		// An image for another board is refused before anything is sent.
		other := genericImage(t)
		if out, err := exec.CommandContext(ctx, string(ctl), "node", "update", "--config", c.OwnerDir(), n.ID(), "--image", other.Dir).CombinedOutput(); err == nil || !strings.Contains(string(out), `the image is for board "generic-x86_64", this node is "qemu-x86_64"`) {
			t.Fatalf("an update to another board's image: %v\n%s", err, out)
		}
	})

	step(t, "power-cut-during-write", func(t *testing.T) {
		// Power cut while slot b is written: the node boots slot a, says the
		// update was interrupted, and is healthy.
		powerCutDuringWrite(t, ctx, c, n, ctl, y)
	})

	step(t, "stage-and-cancel", func(t *testing.T) {
		// Y staged, then cancelled: written and checked, the keys sealed to
		// b's PCRs too, nothing boots it; cancelling drops it and the seal.
		out := ctl.run(t, "node", "update", "--config", c.OwnerDir(), n.ID(), "--image", y.Dir, "--stage")
		t.Logf("plinthctl node update --stage:\n%s", out)
		// The node pushes its status every few seconds.
		rec, err := c.WaitNode(ctx, n, "staged", func(r *clusterpb.Node) bool {
			return r.GetStatus().GetSoftware().GetPending().GetPhase() == "staged"
		})
		if err != nil {
			t.Fatal(err)
		}
		if p := rec.GetStatus().GetSoftware().GetPending(); p.GetVersion() != y.Manifest.Version || p.GetSlot() != "b" || rec.GetStatus().GetVersion() != x.Manifest.Version {
			t.Fatalf("after staging: version %s, pending %v", rec.GetStatus().GetVersion(), p)
		}
		// A power cut while Y is staged: slot a boots as before (its keys
		// unseal with slot a's seal) and Y stays staged.
		boots := rec.GetStatus().GetBootCount()
		if err := c.KillNode(n); err != nil {
			t.Fatal(err)
		}
		if err := c.StartNode(ctx, n); err != nil {
			t.Fatal(err)
		}
		// How the volume opened only /init's console says; the slot it runs
		// and the update still staged, its status.
		mustLine(t, ctx, n.VM(), `I init: storage: unseal node unlock key`)
		if rec, err = c.WaitNode(ctx, n, "staged after the power cut", func(r *clusterpb.Node) bool {
			return r.GetHealth() == clusterpb.NodeHealth_NODE_HEALTH_HEALTHY && r.GetStatus().GetBootCount() > boots
		}); err != nil {
			t.Fatal(err)
		}
		if sw, p := rec.GetStatus().GetSoftware(), rec.GetStatus().GetSoftware().GetPending(); sw.GetSlot() != "a" || p.GetPhase() != "staged" || p.GetVersion() != y.Manifest.Version || p.GetSlot() != "b" {
			t.Fatalf("after a power cut while staged: software %v (want slot a, %s staged in slot b)", sw, y.Manifest.Version)
		}
		if _, err := exec.CommandContext(ctx, string(ctl), "node", "update", "--config", c.OwnerDir(), n.ID(), "--image", y.Dir).CombinedOutput(); err == nil {
			t.Fatal("a second update while one is staged was accepted")
		}
		t.Log(ctl.run(t, "node", "update", "--config", c.OwnerDir(), n.ID(), "--cancel", "--version", y.Manifest.Version))
		if rec, err = c.WaitNode(ctx, n, "without a pending update", func(r *clusterpb.Node) bool { return r.GetStatus().GetSoftware().GetPending() == nil }); err != nil {
			t.Fatal(err)
		}
		if sw := rec.GetStatus().GetSoftware(); !strings.Contains(sw.GetLastFailed().GetReason(), "interrupted") {
			t.Fatalf("after cancelling: software %v (want nothing pending, the interrupted update still the last failure)", sw)
		}
	})

	step(t, "refused-updates", func(t *testing.T) {
		// Y unsigned, and Y signed by a key the cluster does not trust, are
		// refused before anything is sent. Slot b is untouched: X → Y below
		// finds Y's system image in it still.
		refusedUpdates(t, ctx, c, n, ctl, y, dir)
	})

	step(t, "update-x-to-y", func(t *testing.T) {
		// X → Y. Slot b holds Y's system image since the staged update: only
		// the UKI is sent, and the slot is read back as always.
		out := ctl.run(t, "node", "update", "--config", c.OwnerDir(), n.ID(), "--image", y.Dir)
		t.Logf("plinthctl node update:\n%s", out)
		if !strings.Contains(out, fmt.Sprintf("runs %s from slot b, healthy", y.Manifest.Version)) {
			t.Fatalf("plinthctl node update did not report the node healthy on %s in slot b", y.Manifest.Version)
		}
		if !strings.Contains(out, "slot b holds this system image already: not sent") {
			t.Error("the system image the cancelled update wrote to slot b was sent again")
		}
		// The trial, the PCRs and how the volume opened only /init's console
		// says; the slot, version, boot count and the confirmation (nothing
		// pending), the node's status.
		vm := n.VM()
		mustLine(t, ctx, vm, `I init: A/B update state detail="slot b: trial boot of version `+regexp.QuoteMeta(y.Manifest.Version))
		pcrs := mustLine(t, ctx, vm, `I init: measured boot: live PCRs equal the UKI's predictions uki=EFI/plinth/b.efi detail="PCR 4 ([0-9a-f]{64}): match; PCR 11 ([0-9a-f]{64}): match"`)
		if want := y.Manifest.UKIs[image.UKISlotFile("b")].PCR11; pcrs[2] != want {
			t.Errorf("PCR 11 %s, the manifest predicts %s", pcrs[2], want)
		}
		mustLine(t, ctx, vm, `I init: storage: unseal node unlock key`)
		wantNodeBootCount(t, ctx, c, n, 4) // flashed, two power cuts, updated
		assertNoLine(t, vm, `make ext4 filesystem`)
		// plinthctl returned once the record showed the new slot confirmed.
		rec := nodeRecord(t, ctx, c, n.ID())
		if sw := rec.GetStatus().GetSoftware(); rec.GetStatus().GetVersion() != y.Manifest.Version || sw.GetSlot() != "b" || sw.GetPending() != nil {
			t.Fatalf("after the update: version %s, software %v (want %s confirmed in slot b)", rec.GetStatus().GetVersion(), sw, y.Manifest.Version)
		}
		if again, err := c.Client().Ticket(ctx); err != nil || !bytes.Equal(again, ticket) {
			t.Fatalf("the cluster's register ticket changed across the update (%v): its data was lost", err)
		}
	})

	step(t, "release-key-change", func(t *testing.T) {
		// The release keys: the owner's certificate alone adds none; a key
		// set the current key signed adds K2, which the node follows.
		k2 = releaseKeyChange(t, ctx, c, ctl, dir)
	})

	step(t, "halting-update", func(t *testing.T) {
		// Y → an image that halts, of X's (older) release, signed by K2: a
		// downgrade, refused without a statement and with one of a key the
		// cluster does not have, installed with K2's. Its trial boot of slot
		// a stops before the data disk, reboots, and slot b runs again.
		halting := haltingImage(t, x, filepath.Join(dir, "halting-image"), "hang", k2.key, x.Manifest.Release)
		refusedDowngrades(t, ctx, c, n, ctl, halting, dir)
		trialBoot := n.Boots() + 1
		cmd := exec.CommandContext(ctx, string(ctl), "node", "update", "--config", c.OwnerDir(), n.ID(), "--image", halting, "--allow-downgrade", "--sign-key", k2.file)
		outb, err := cmd.CombinedOutput()
		t.Logf("plinthctl node update (halting image):\n%s", outb)
		if err == nil || !strings.Contains(string(outb), "failed, the node runs slot b") {
			t.Fatalf("the update to a halting image did not fail as it should (%v)", err)
		}
		// Slot a still held X's system image, which the halting image shares:
		// only the UKI was sent.
		if !strings.Contains(string(outb), "slot a holds this system image already: not sent") || strings.Contains(string(outb), "sending system.img") {
			t.Error("the system image slot a already held was sent again")
		}
		trial := consoleOf(t, n, trialBoot)
		for _, want := range []string{`A/B update state detail="slot a: trial boot .*; watchdog \(Software Watchdog\) armed, 30s`,
			`E init: plinth.halt=hang on the kernel command line: the core stops here`, `softdog: Initiating system reboot`} {
			if !regexp.MustCompile(want).MatchString(trial) {
				t.Errorf("the trial boot's console has no line matching %q", want)
			}
		}
		// The seal dropped only /init's console says; the failure and the
		// slot the node runs again, its status.
		vm := n.VM()
		mustLine(t, ctx, vm, `I init: update: keys sealed to this slot alone again`)
		rec := nodeRecord(t, ctx, c, n.ID())
		sw := rec.GetStatus().GetSoftware()
		if f := sw.GetLastFailed(); rec.GetStatus().GetVersion() != y.Manifest.Version || sw.GetSlot() != "b" || sw.GetPending() != nil ||
			f.GetVersion() != "halting" || f.GetSlot() != "a" || !strings.Contains(f.GetReason(), "did not confirm") {
			t.Fatalf("after the failed update: version %s, software %v (want %s in slot b, the update to halting in slot a failed)", rec.GetStatus().GetVersion(), sw, y.Manifest.Version)
		}
	})
}

// powerCutDuringWrite starts an update of n to img and kills QEMU while
// the node writes slot b (its update state "writing", which lasts until
// the slot is written, read back and sealed for): the next boot runs slot
// a and reports the interrupted update; the node comes back healthy.
func powerCutDuringWrite(t *testing.T, ctx context.Context, c *launch.Cluster, n *launch.ClusterNode, ctl plinthctl, img *launch.Image) {
	t.Helper()
	boots := nodeRecord(t, ctx, c, n.ID()).GetStatus().GetBootCount()
	cmd := exec.CommandContext(ctx, string(ctl), "node", "update", "--config", c.OwnerDir(), n.ID(), "--image", img.Dir)
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	if _, err := c.WaitStatus(ctx, n, "slot b being written", func(st *clusterpb.StatusResponse) bool {
		p := st.GetStatus().GetSoftware().GetPending()
		return p.GetPhase() == "writing" && p.GetSlot() == "b" && p.GetVersion() == img.Manifest.Version
	}); err != nil {
		t.Fatal(err)
	}
	if err := c.KillNode(n); err != nil {
		t.Fatal(err)
	}
	waited := make(chan error, 1)
	go func() { waited <- cmd.Wait() }()
	select {
	case err := <-waited:
		if err == nil {
			t.Fatalf("plinthctl node update succeeded although the node lost power:\n%s", out.String())
		}
	case <-time.After(time.Minute):
		cmd.Process.Kill()
		t.Fatalf("plinthctl node update still waits a minute after the node lost power:\n%s", out.String())
	}
	t.Logf("plinthctl node update, power cut:\n%s", out.String())
	if err := c.StartNode(ctx, n); err != nil {
		t.Fatal(err)
	}
	// How the volume opened only /init's console says; the failure and
	// the slot the node runs, its status (of this boot: pushed every few
	// seconds, the record may show the last boot's a moment longer).
	mustLine(t, ctx, n.VM(), `I init: storage: unseal node unlock key`)
	rec, err := c.WaitNode(ctx, n, "HEALTHY after the power cut", func(r *clusterpb.Node) bool {
		return r.GetHealth() == clusterpb.NodeHealth_NODE_HEALTH_HEALTHY && r.GetStatus().GetBootCount() > boots
	})
	if err != nil {
		t.Fatal(err)
	}
	if sw, f := rec.GetStatus().GetSoftware(), rec.GetStatus().GetSoftware().GetLastFailed(); sw.GetSlot() != "a" || sw.GetPending() != nil ||
		f.GetVersion() != img.Manifest.Version || f.GetSlot() != "b" || !strings.Contains(f.GetReason(), "interrupted while slot b was written") {
		t.Fatalf("after the power cut: software %v (want slot a, nothing pending, the update to %s in slot b interrupted)", sw, img.Manifest.Version)
	}
}

// refusedUpdates: copies of img without manifest.sig, and with a
// manifest.sig of another key, are refused by the node (its cluster's
// release key is the one make signs with, from the bootstrap image):
// plinthctl node update fails saying why, the node's answer to the owner's
// client is the refusal (InvalidArgument, the reason, before it accepted
// anything), nothing was written (no "writing" line this boot) and its
// update status is as before. The copies link img's artefacts: only
// manifest.sig differs.
func refusedUpdates(t *testing.T, ctx context.Context, c *launch.Cluster, n *launch.ClusterNode, ctl plinthctl, img *launch.Image, dir string) {
	t.Helper()
	before := nodeRecord(t, ctx, c, n.ID()).GetStatus().GetSoftware()
	manifest, err := os.ReadFile(filepath.Join(img.Dir, image.ManifestFile))
	if err != nil {
		t.Fatal(err)
	}
	_, otherKey, err := ed25519.GenerateKey(rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	for _, r := range []struct {
		name string
		sig  []byte // nil: no manifest.sig
		want string
	}{
		{"unsigned", nil, "the image is not signed (no manifest.sig)"},
		{"other-key", ed25519.Sign(otherKey, manifest), "the image's signature does not verify against any of the cluster's 1 release key"},
	} {
		copyDir := imageCopy(t, img, filepath.Join(dir, "refused-"+r.name), r.sig)
		out, err := exec.CommandContext(ctx, string(ctl), "node", "update", "--config", c.OwnerDir(), n.ID(), "--image", copyDir).CombinedOutput()
		t.Logf("plinthctl node update (%s):\n%s", r.name, out)
		if err == nil || !strings.Contains(string(out), "node "+n.ID()+" refused the image of version "+img.Manifest.Version+": ") || !strings.Contains(string(out), r.want) {
			t.Fatalf("an update to a %s copy of %s: %v, want the node's refusal saying %q", r.name, img.Manifest.Version, err, r.want)
		}
		if strings.Contains(string(out), "sending ") {
			t.Errorf("the %s image's artefacts were sent", r.name)
		}
		refusedByNode(t, ctx, c, n, copyDir, r.want)
	}
	// Nothing written this boot: no API keeps a boot's history of writes
	// (an install that began and failed would also show in the update
	// status compared below).
	assertNoLine(t, n.VM(), `update: writing the system image to slot b`)
	after := nodeRecord(t, ctx, c, n.ID()).GetStatus().GetSoftware()
	if after.GetSlot() != before.GetSlot() || after.GetPending() != nil || after.GetLastFailed().GetReason() != before.GetLastFailed().GetReason() {
		t.Fatalf("the refused updates changed the node's update status: %v, before %v", after, before)
	}
}

// refusedByNode sends the image in dir to n through the owner's client
// (to be staged, were it accepted) and fails unless n refuses it at once:
// a *owner.RefusedError, InvalidArgument, saying want, no progress.
func refusedByNode(t *testing.T, ctx context.Context, c *launch.Cluster, n *launch.ClusterNode, dir, want string) {
	t.Helper()
	img, err := owner.ReadUpdateImage(dir)
	if err != nil {
		t.Fatal(err)
	}
	// Progress comes from two goroutines (sending, the node's answers).
	var progressed atomic.Bool
	_, err = c.Client().Update(ctx, n.ID(), img, owner.UpdateStage, func(*clusterpb.UpdateProgress) { progressed.Store(true) })
	var refused *owner.RefusedError
	if !errors.As(err, &refused) || status.Code(refused.Err) != codes.InvalidArgument || !strings.Contains(status.Convert(refused.Err).Message(), want) || progressed.Load() {
		t.Fatalf("the node's answer to %s: %v (progress reported: %v), want its refusal (InvalidArgument) saying %q before anything is sent", dir, err, progressed.Load(), want)
	}
}

// imageCopy makes dir an image directory with img's artefacts (symbolic
// links: ~700 MiB are not copied) and manifest, and sig as its
// manifest.sig (none if nil).
func imageCopy(t *testing.T, img *launch.Image, dir string, sig []byte) string {
	t.Helper()
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	ents, err := os.ReadDir(img.Dir)
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range ents {
		if e.Name() == image.SignatureFile {
			continue
		}
		if err := os.Symlink(filepath.Join(img.Dir, e.Name()), filepath.Join(dir, e.Name())); err != nil && !os.IsExist(err) {
			t.Fatal(err)
		}
	}
	if sig != nil {
		if err := os.WriteFile(filepath.Join(dir, image.SignatureFile), sig, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	return dir
}

// devReleaseKey is the release key make signs the test images with
// (PLINTH_RELEASE_KEY, else out/release.key): the clusters the tests
// bootstrap trust it (the bootstrap image's key), so an image a test
// makes is signed with it too.
func devReleaseKey(t *testing.T) ed25519.PrivateKey {
	t.Helper()
	file := builtPath(t, "PLINTH_RELEASE_KEY", "release.key")
	b, err := os.ReadFile(file)
	if err != nil {
		t.Fatalf("%v (make image makes the development release key)", err)
	}
	k, err := pki.ParsePrivateKeyPEM(b)
	if err != nil {
		t.Fatalf("%s: %v", file, err)
	}
	return k
}

// nodeRecord waits until node id is HEALTHY and returns its record.
func nodeRecord(t *testing.T, ctx context.Context, c *launch.Cluster, id string) *clusterpb.Node {
	t.Helper()
	for {
		n, err := c.Client().FindNode(ctx, id)
		if err == nil && n.GetHealth() == clusterpb.NodeHealth_NODE_HEALTH_HEALTHY && n.GetStatus().GetSoftware() != nil {
			return n
		}
		select {
		case <-ctx.Done():
			t.Fatalf("node %s not healthy: %v (%v)", id, n, err)
		case <-time.After(time.Second):
		}
	}
}

// consoleOf returns the console log of boot k of n.
func consoleOf(t *testing.T, n *launch.ClusterNode, k int) string {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(n.Dir, fmt.Sprintf("boot%d", k), "console.log"))
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

// haltingImage writes to dir an image directory for an update to slot a
// that cannot succeed: img's system image with slot a's UKI rebuilt to
// carry plinth.halt=halt, as version "halting". With halt "hang" the
// core stops before the data disk (a hang: the watchdog resets the
// machine); any other value fails that boot step (the trial reboots by
// itself). Only the manifest, system image and UKI an update sends; the
// manifest signed with key as release (nil, 0: the development release
// key, the next image's release, which the nodes run when they get this
// one: not a downgrade).
func haltingImage(t *testing.T, img *launch.Image, dir, halt string, key ed25519.PrivateKey, release uint64) string {
	t.Helper()
	dir = filepath.Join(dir, "halting")
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	uki := image.UKISlotFile("a")
	if _, err := image.RebuildUKI(filepath.Join(img.Dir, uki), "", filepath.Join(dir, uki), func(c string) string { return c + " plinth.halt=" + halt }); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink(filepath.Join(img.Dir, image.SystemFile), filepath.Join(dir, image.SystemFile)); err != nil {
		t.Fatal(err)
	}
	m := *img.Manifest
	m.Version = "halting"
	if key == nil {
		key, release = devReleaseKey(t), nextImage(t).Manifest.Release
	}
	m.Release = release
	m.Artefacts = map[string]image.Artefact{image.SystemFile: img.Manifest.Artefacts[image.SystemFile]}
	data, err := os.ReadFile(filepath.Join(dir, uki))
	if err != nil {
		t.Fatal(err)
	}
	sum := sha256.Sum256(data)
	m.Artefacts[uki] = image.Artefact{SHA256: hex.EncodeToString(sum[:]), Size: int64(len(data))}
	if err := image.WriteManifest(dir, &m, key); err != nil {
		t.Fatal(err)
	}
	return dir
}
