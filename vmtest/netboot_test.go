//go:build built

package vmtest

import (
	"context"
	"os/exec"
	"strings"
	"testing"
	"time"

	"plinth.dev/plinth/launch"
)

// TestNetBoot: a node boots the cluster's network-boot UKI through OVMF's
// UEFI HTTP boot (served by the harness, the register parameters in the
// UKI's measured command line), registers with the cluster, is approved
// and becomes HEALTHY; its firmware measured the UKI, so it seals its key
// without the unmeasured-boot exception. An update of it is refused: it
// has no slots.
func TestNetBoot(t *testing.T) {
	// Parallel with TestDiskBoot: OVMF under TCG runs on one vCPU (one
	// host core) for most of these tests, firmware and HTTP download.
	parallel(t, 130*time.Second)
	ctx, cancel := context.WithTimeout(context.Background(), 15*time.Minute)
	defer cancel()
	c, err := launch.LaunchCluster(ctx, launch.ClusterOptions{Nodes: 1, Image: testImage(t), Dir: testDir(t), DiskSizeBytes: testDiskSize, Progress: logWriter{t}, NetBoot: true})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	n, err := c.AddNode(ctx, launch.NetBoot())
	if err != nil {
		t.Fatal(err)
	}
	vm := n.VM()
	mustLine(t, ctx, vm, `Start HTTP Boot over IPv4`)
	mustLine(t, ctx, vm, `I init: map and mount the system image \(dm-verity\) detail=.*\(the initramfs\)`)
	mustLine(t, ctx, vm, `I init: read node parameters detail="?from cmdline.*register with a cluster`)
	mustLine(t, ctx, vm, `I init: TPM and measured boot detail=.*firmware measured the UKI`)
	assertNoLine(t, vm, `unmeasured boot`)
	// A network-booted node has no slots: an update is refused, naming
	// the alternative.
	out, err := exec.CommandContext(ctx, string(buildPlinthctl(t)), "node", "update", "--config", c.OwnerDir(), n.ID(), "--image", testImage(t).Dir).CombinedOutput()
	if err == nil || !strings.Contains(string(out), "has no system slots (a network boot): boot it from the new image's network-boot UKI instead") {
		t.Errorf("update of a network-booted node: %v\n%s", err, out)
	}
}
