package vmtest

import (
	"bytes"
	"context"
	"crypto/ed25519"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"plinth.dev/plinth/api/clusterpb"
	"plinth.dev/plinth/image"
	"plinth.dev/plinth/platform/pki"
)

// nextImage is the image `make image-next` built: the test image's
// binaries and board with another version, so another system image.
func nextImage(t *testing.T) *Image {
	t.Helper()
	dir := os.Getenv("PLINTH_NEXT_IMAGE")
	if dir == "" {
		root, err := repoRoot()
		if err != nil {
			t.Fatal(err)
		}
		dir = filepath.Join(root, "out", "image-next", "qemu-x86_64")
	}
	img, err := LoadImage(dir)
	if err != nil {
		t.Fatalf("%v (make image-next builds it)", err)
	}
	return img
}

// TestUpdate: a node booted from its flashed disk (OVMF + swtpm) refuses
// an image for another board, and comes back on its slot after a power
// cut while it writes the new one (the update reported as interrupted).
// Y staged (`-stage`: written, checked, sealed for, not booted) stays
// staged across a power cut (slot a boots as before), refuses a second
// update and is cancelled (`-cancel`). Y without its manifest.sig, and
// Y with a signature of a key the cluster does not trust, are refused by
// the node before anything is sent, slot b and the status untouched. The
// node is then updated
// with `plinthctl update` from version X to Y: Y's UKI is written (slot b
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
	dir := TestDir(t)
	c, err := LaunchCluster(ctx, ClusterOptions{Nodes: 1, Image: x, Dir: dir, DiskSizeBytes: 2 << 30, Progress: logWriter{t}, DiskBoot: true})
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

	// An image for another board is refused before anything is sent.
	other := genericImage(t)
	if out, err := exec.CommandContext(ctx, string(ctl), "update", "-config", c.OwnerDir(), n.ID(), "-image", other.Dir).CombinedOutput(); err == nil || !strings.Contains(string(out), `the image is for board "generic-x86_64", this node is "qemu-x86_64"`) {
		t.Fatalf("an update to another board's image: %v\n%s", err, out)
	}

	// Power cut while slot b is written: the node boots slot a, says the
	// update was interrupted, and is healthy.
	powerCutDuringWrite(t, ctx, c, n, ctl, y)

	// Y staged, then cancelled: written and checked, the keys sealed to
	// b's PCRs too, nothing boots it; cancelling drops it and the seal.
	out := ctl.run(t, "update", "-config", c.OwnerDir(), n.ID(), "-image", y.Dir, "-stage")
	t.Logf("plinthctl update -stage:\n%s", out)
	// The node pushes its status every few seconds.
	rec, err := c.waitNode(ctx, n, "staged", func(r *clusterpb.Node) bool {
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
	mustLine(t, ctx, n.VM(), `I init: A/B update state detail="slot a; version `+regexp.QuoteMeta(y.Manifest.Version)+` is staged in slot b`)
	mustLine(t, ctx, n.VM(), `I init: map and mount the system image \(dm-verity\) detail=.*\(slot a\)`)
	mustLine(t, ctx, n.VM(), `I init: storage: unseal node unlock key`)
	if rec, err = c.waitNode(ctx, n, "staged after the power cut", func(r *clusterpb.Node) bool {
		return r.GetHealth() == clusterpb.NodeHealth_NODE_HEALTH_HEALTHY && r.GetStatus().GetBootCount() > boots
	}); err != nil {
		t.Fatal(err)
	}
	if sw := rec.GetStatus().GetSoftware(); sw.GetSlot() != "a" || sw.GetPending().GetPhase() != "staged" || sw.GetPending().GetVersion() != y.Manifest.Version {
		t.Fatalf("after a power cut while staged: software %v (want slot a, %s staged)", sw, y.Manifest.Version)
	}
	if _, err := exec.CommandContext(ctx, string(ctl), "update", "-config", c.OwnerDir(), n.ID(), "-image", y.Dir).CombinedOutput(); err == nil {
		t.Fatal("a second update while one is staged was accepted")
	}
	t.Log(ctl.run(t, "update", "-config", c.OwnerDir(), n.ID(), "-cancel", "-version", y.Manifest.Version))
	mustLine(t, ctx, n.VM(), `I init: update cancelled version=`+regexp.QuoteMeta(y.Manifest.Version)+` slot=b`)
	if rec, err = c.waitNode(ctx, n, "without a pending update", func(r *clusterpb.Node) bool { return r.GetStatus().GetSoftware().GetPending() == nil }); err != nil {
		t.Fatal(err)
	}
	if sw := rec.GetStatus().GetSoftware(); !strings.Contains(sw.GetLastFailed().GetReason(), "interrupted") {
		t.Fatalf("after cancelling: software %v (want nothing pending, the interrupted update still the last failure)", sw)
	}

	// Y unsigned, and Y signed by a key the cluster does not trust, are
	// refused before anything is sent. Slot b is untouched: X → Y below
	// finds Y's system image in it still.
	refusedUpdates(t, ctx, c, n, ctl, y, dir)

	// X → Y. Slot b holds Y's system image since the staged update: only
	// the UKI is sent, and the slot is read back as always.
	out = ctl.run(t, "update", "-config", c.OwnerDir(), n.ID(), "-image", y.Dir)
	t.Logf("plinthctl update:\n%s", out)
	if !strings.Contains(out, fmt.Sprintf("runs %s from slot b, healthy", y.Manifest.Version)) {
		t.Fatalf("plinthctl update did not report the node healthy on %s in slot b", y.Manifest.Version)
	}
	if !strings.Contains(out, "slot b holds this system image already: not sent") {
		t.Error("the system image the cancelled update wrote to slot b was sent again")
	}
	vm := n.VM()
	mustLine(t, ctx, vm, `I init: A/B update state detail="slot b: trial boot of version `+regexp.QuoteMeta(y.Manifest.Version))
	mustLine(t, ctx, vm, `I init: map and mount the system image \(dm-verity\) detail=.*\(slot b\)`)
	pcrs := mustLine(t, ctx, vm, `I init: measured boot: live PCRs equal the UKI's predictions uki=EFI/plinth/b.efi detail="PCR 4 ([0-9a-f]{64}): match; PCR 11 ([0-9a-f]{64}): match"`)
	if want := y.Manifest.UKIs[image.UKISlotFile("b")].PCR11; pcrs[2] != want {
		t.Errorf("PCR 11 %s, the manifest predicts %s", pcrs[2], want)
	}
	mustLine(t, ctx, vm, `I init: storage: unseal node unlock key`)
	wantBootCount(t, ctx, vm, "4") // flashed, two power cuts, updated
	mustLine(t, ctx, vm, `I init: update confirmed`)
	assertNoLine(t, vm, `make ext4 filesystem`)
	rec = nodeRecord(t, ctx, c, n.ID())
	if sw := rec.GetStatus().GetSoftware(); rec.GetStatus().GetVersion() != y.Manifest.Version || sw.GetSlot() != "b" || sw.GetPending() != nil {
		t.Fatalf("after the update: version %s, software %v", rec.GetStatus().GetVersion(), sw)
	}
	if again, err := c.Client().Ticket(ctx); err != nil || !bytes.Equal(again, ticket) {
		t.Fatalf("the cluster's register ticket changed across the update (%v): its data was lost", err)
	}

	// Y → an image that halts: the trial boot of slot a stops before the
	// data disk, reboots, and slot b runs again.
	halting := haltingImage(t, x, filepath.Join(dir, "halting-image"), "hang")
	trialBoot := n.Boots() + 1
	cmd := exec.CommandContext(ctx, string(ctl), "update", "-config", c.OwnerDir(), n.ID(), "-image", halting)
	outb, err := cmd.CombinedOutput()
	t.Logf("plinthctl update (halting image):\n%s", outb)
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
	vm = n.VM()
	mustLine(t, ctx, vm, `E init: update failed version=halting slot=a`)
	mustLine(t, ctx, vm, `I init: map and mount the system image \(dm-verity\) detail=.*\(slot b\)`)
	mustLine(t, ctx, vm, `I init: update: keys sealed to this slot alone again`)
	rec = nodeRecord(t, ctx, c, n.ID())
	sw := rec.GetStatus().GetSoftware()
	if rec.GetStatus().GetVersion() != y.Manifest.Version || sw.GetSlot() != "b" || sw.GetPending() != nil || !strings.Contains(sw.GetLastFailed().GetReason(), "did not confirm") {
		t.Fatalf("after the failed update: version %s, software %v", rec.GetStatus().GetVersion(), sw)
	}
}

// powerCutDuringWrite starts an update of n to img and kills QEMU while
// the node writes the system image into slot b: the next boot runs slot a
// and reports the interrupted update; the node comes back healthy.
func powerCutDuringWrite(t *testing.T, ctx context.Context, c *Cluster, n *ClusterNode, ctl plinthctl, img *Image) {
	t.Helper()
	vm := n.VM()
	cmd := exec.CommandContext(ctx, string(ctl), "update", "-config", c.OwnerDir(), n.ID(), "-image", img.Dir)
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	mustLine(t, ctx, vm, `I root\.roleserver\.nodemgmt: update: writing the system image to slot b done=[1-9]`)
	if err := c.KillNode(n); err != nil {
		t.Fatal(err)
	}
	waited := make(chan error, 1)
	go func() { waited <- cmd.Wait() }()
	select {
	case err := <-waited:
		if err == nil {
			t.Fatalf("plinthctl update succeeded although the node lost power:\n%s", out.String())
		}
	case <-time.After(time.Minute):
		cmd.Process.Kill()
		t.Fatalf("plinthctl update still waits a minute after the node lost power:\n%s", out.String())
	}
	t.Logf("plinthctl update, power cut:\n%s", out.String())
	if err := c.StartNode(ctx, n); err != nil {
		t.Fatal(err)
	}
	vm = n.VM()
	mustLine(t, ctx, vm, `E init: update failed version=`+regexp.QuoteMeta(img.Manifest.Version)+` slot=b reason="the update to version .* was interrupted while slot b was written`)
	mustLine(t, ctx, vm, `I init: map and mount the system image \(dm-verity\) detail=.*\(slot a\)`)
	mustLine(t, ctx, vm, `I init: storage: unseal node unlock key`)
	rec := nodeRecord(t, ctx, c, n.ID())
	if sw := rec.GetStatus().GetSoftware(); sw.GetSlot() != "a" || sw.GetPending() != nil || !strings.Contains(sw.GetLastFailed().GetReason(), "interrupted while slot b was written") {
		t.Fatalf("after the power cut: software %v", sw)
	}
}

// refusedUpdates: copies of img without manifest.sig, and with a
// manifest.sig of another key, are refused by the node (its cluster's
// release key is the one make signs with, from the bootstrap image):
// plinthctl update fails saying why, the node logs the refusal, nothing
// was written (no "writing" line this boot) and its update status is
// as before. The copies link img's artefacts: only manifest.sig differs.
func refusedUpdates(t *testing.T, ctx context.Context, c *Cluster, n *ClusterNode, ctl plinthctl, img *Image, dir string) {
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
		out, err := exec.CommandContext(ctx, string(ctl), "update", "-config", c.OwnerDir(), n.ID(), "-image", copyDir).CombinedOutput()
		t.Logf("plinthctl update (%s):\n%s", r.name, out)
		if err == nil || !strings.Contains(string(out), "node "+n.ID()+" refused the image of version "+img.Manifest.Version+": ") || !strings.Contains(string(out), r.want) {
			t.Fatalf("an update to a %s copy of %s: %v, want the node's refusal saying %q", r.name, img.Manifest.Version, err, r.want)
		}
		if strings.Contains(string(out), "sending ") {
			t.Errorf("the %s image's artefacts were sent", r.name)
		}
		mustLine(t, ctx, n.VM(), `W root\.roleserver\.nodemgmt: update refused .*`+regexp.QuoteMeta(r.want))
	}
	assertNoLine(t, n.VM(), `update: writing the system image to slot b`)
	after := nodeRecord(t, ctx, c, n.ID()).GetStatus().GetSoftware()
	if after.GetSlot() != before.GetSlot() || after.GetPending() != nil || after.GetLastFailed().GetReason() != before.GetLastFailed().GetReason() {
		t.Fatalf("the refused updates changed the node's update status: %v, before %v", after, before)
	}
}

// imageCopy makes dir an image directory with img's artefacts (symbolic
// links: ~700 MiB are not copied) and manifest, and sig as its
// manifest.sig (none if nil).
func imageCopy(t *testing.T, img *Image, dir string, sig []byte) string {
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
	file := os.Getenv("PLINTH_RELEASE_KEY")
	if file == "" {
		root, err := repoRoot()
		if err != nil {
			t.Fatal(err)
		}
		file = filepath.Join(root, "out", "release.key")
	}
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
func nodeRecord(t *testing.T, ctx context.Context, c *Cluster, id string) *clusterpb.Node {
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
func consoleOf(t *testing.T, n *ClusterNode, k int) string {
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
// manifest signed with the development release key as the next image's
// release (the nodes run it when they get this one: not a downgrade).
func haltingImage(t *testing.T, img *Image, dir, halt string) string {
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
	m.Release = nextImage(t).Manifest.Release
	m.Artefacts = map[string]image.Artefact{image.SystemFile: img.Manifest.Artefacts[image.SystemFile]}
	data, err := os.ReadFile(filepath.Join(dir, uki))
	if err != nil {
		t.Fatal(err)
	}
	sum := sha256.Sum256(data)
	m.Artefacts[uki] = image.Artefact{SHA256: hex.EncodeToString(sum[:]), Size: int64(len(data))}
	if err := image.WriteManifest(dir, &m, devReleaseKey(t)); err != nil {
		t.Fatal(err)
	}
	return dir
}
