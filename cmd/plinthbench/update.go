package main

import (
	"bufio"
	"bytes"
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"time"

	"plinth.dev/plinth/api/clusterpb"
	"plinth.dev/plinth/image"
	"plinth.dev/plinth/launch"
)

// benchUpdate launches a three-node cluster booted from flashed disks
// (OVMF + swtpm), makes every node a consensus member, updates one node to
// next with `plinthctl node update` (bytes sent, time to install, reboot
// to HEALTHY on the new slot), then all three with `plinthctl cluster
// update` (total time), as an operator would.
func benchUpdate(ctx context.Context, img, next *launch.Image, plinthctl, work string, add addFunc) error {
	c, err := launch.LaunchCluster(ctx, launch.ClusterOptions{Nodes: 3, Image: img, Dir: filepath.Join(work, "update"), DiskSizeBytes: 2 << 30, Progress: os.Stderr, DiskBoot: true})
	if err != nil {
		return err
	}
	defer c.Close()
	cfg := c.OwnerDir()
	nodes := c.Nodes()
	for _, n := range nodes[1:] {
		if out, err := exec.CommandContext(ctx, plinthctl, "role", "add", "--config", cfg, n.ID(), "consensus-member").CombinedOutput(); err != nil {
			return fmt.Errorf("role add: %v: %s", err, out)
		}
	}
	for _, n := range nodes {
		if err := waitVoter(ctx, c, n.ID()); err != nil {
			return err
		}
	}
	sent := next.Manifest.Artefacts[image.SystemFile].Size + next.Manifest.Artefacts[image.UKISlotFile("b")].Size
	out, took, err := runTimed(ctx, plinthctl, "node", "update", "--config", cfg, nodes[0].ID(), "--image", next.Dir)
	if err != nil {
		return fmt.Errorf("node update: %v\n%s", err, out)
	}
	installed := regexp.MustCompile(`installed in slot b in (\S+)`).FindSubmatch(out)
	healthy := regexp.MustCompile(`healthy, after (\S+)`).FindSubmatch(out)
	if installed == nil || healthy == nil {
		return fmt.Errorf("node update: unexpected output:\n%s", out)
	}
	inst, err := time.ParseDuration(string(installed[1]))
	if err != nil {
		return err
	}
	total, err := time.ParseDuration(string(healthy[1]))
	if err != nil {
		return err
	}
	add("update_bytes_sent_mib", float64(sent)/(1<<20), "MiB", "system image + slot UKI, streamed over NodeManagement.Update")
	add("update_install_seconds", inst.Seconds(), "s", accelName()+", plinthctl node update: first byte to installed (slot written, read back through dm-verity, UKI, reseal, BootNext)")
	add("update_reboot_to_healthy_seconds", (total - inst).Seconds(), "s", "installed to HEALTHY on the new slot, a voter again (3-member cluster)")
	add("update_one_node_seconds", took.Seconds(), "s", "the whole plinthctl node update")

	out, took, err = runTimed(ctx, plinthctl, "cluster", "update", "--config", cfg, "--image", next.Dir)
	if err != nil {
		return fmt.Errorf("cluster update: %v\n%s", err, out)
	}
	add("update_rolling_3_nodes_seconds", took.Seconds(), "s", "plinthctl cluster update: three consensus members, one at a time, each a voter again before the next")
	return nil
}

// runTimed runs a command, copying its output to stderr as it comes.
func runTimed(ctx context.Context, name string, args ...string) ([]byte, time.Duration, error) {
	cmd := exec.CommandContext(ctx, name, args...)
	var buf bytes.Buffer
	pr, pw, err := os.Pipe()
	if err != nil {
		return nil, 0, err
	}
	cmd.Stdout, cmd.Stderr = pw, pw
	start := time.Now()
	if err := cmd.Start(); err != nil {
		pw.Close()
		pr.Close()
		return nil, 0, err
	}
	pw.Close()
	sc := bufio.NewScanner(pr)
	for sc.Scan() {
		fmt.Fprintln(os.Stderr, "  | "+sc.Text())
		buf.Write(append(sc.Bytes(), '\n'))
	}
	pr.Close()
	err = cmd.Wait()
	return buf.Bytes(), time.Since(start), err
}

// waitVoter waits until node id is UP, HEALTHY and a voting etcd member.
func waitVoter(ctx context.Context, c *launch.Cluster, id string) error {
	ctx, cancel := context.WithTimeout(ctx, 10*time.Minute)
	defer cancel()
	for {
		n, err := c.Client().FindNode(ctx, id)
		if err == nil && n.GetHealth() == clusterpb.NodeHealth_NODE_HEALTH_HEALTHY && n.GetConsensusMembership() == clusterpb.ConsensusMembership_CONSENSUS_MEMBERSHIP_VOTER {
			return nil
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("%s is not a healthy voter: %v", id, err)
		case <-time.After(2 * time.Second):
		}
	}
}
