//go:build built

package vmtest

import (
	"bytes"
	"context"
	"fmt"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"plinth.dev/plinth/api/clusterpb"
	"plinth.dev/plinth/launch"
	"plinth.dev/plinth/platform/supervisor"
)

// TestRollingUpdateAndFailover: three consensus members booted from
// their disks (OVMF + swtpm; nodes 2 and 3 made members back to back,
// although etcd admits one learner at a time), one of them also a
// Kubernetes worker in a cluster without a Kubernetes controller, are
// updated to the next image with `plinthctl cluster update` (--drain=false:
// there is no API server to drain through) while a writer keeps writing
// through the cluster's API (rollingUpdate). The registered members'
// trial boots open their volumes with their join state, which was sealed
// to slot b's predicted PCRs too. A second rolling update, to an image
// that fails at boot, stops at its first node, which rolls back by
// itself (failedRollingUpdate). Then the updated cluster loses its
// curator leader to a power cut (failover).
//
// One cluster for both: under TCG a launch of three members costs ~1.5
// min of the two cores `make test` has.
func TestRollingUpdateAndFailover(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Minute)
	defer cancel()
	ctl := buildPlinthctl(t)
	next := nextImage(t)
	dir := testDir(t)
	c := launchMembers(t, ctx, ctl, launch.ClusterOptions{Image: testImage(t), Dir: dir, DiskSizeBytes: 2 << 30, Progress: logWriter{t}, DiskBoot: true})
	defer c.Close()
	nodes := c.Nodes()
	cfg := c.OwnerDir()
	t.Log(ctl.run(t, "role", "add", "--config", cfg, nodes[2].ID(), "kubernetes-worker"))

	step(t, "rolling-update", func(t *testing.T) {
		rollingUpdate(t, ctx, c, ctl, next, "--drain=false")
		// That the boot was a trial (its update state is "trial" only until
		// it confirms) and which key opened the volume, only the console
		// says.
		for _, n := range nodes[1:] {
			mustLine(t, ctx, n.VM(), `I init: A/B update state detail="slot b: trial boot`)
			mustLine(t, ctx, n.VM(), `I root\.enrolment: consensus member: the cluster unlock key is sealed locally`)
		}
		t.Log(ctl.run(t, "node", "list", "--config", cfg))
	})

	step(t, "failed-rolling-update", func(t *testing.T) {
		// The trial fails a boot step (a hang, reset by the watchdog, is
		// TestUpdate's): what counts here is where plinthctl stops.
		failedRollingUpdate(t, ctx, c, ctl, next, haltingImage(t, testImage(t), filepath.Join(dir, "halting-image"), "fail", nil, 0))
	})

	step(t, "failover", func(t *testing.T) {
		failover(t, ctx, c, ctl)
	})
}

// failedRollingUpdate runs `plinthctl cluster update` of every node of c,
// which runs cur, to the image in dir, whose trial boot fails before the
// cluster: the first node reboots and runs cur from its slot again, with
// the failed update in its status;
// plinthctl stops there and says where, and cancels the update it
// staged on the second node meanwhile; the third is never touched.
func failedRollingUpdate(t *testing.T, ctx context.Context, c *launch.Cluster, ctl plinthctl, cur *launch.Image, dir string) {
	t.Helper()
	// The order plinthctl takes: every node is a consensus member, so by ID.
	var ids []string
	for _, n := range c.Nodes() {
		ids = append(ids, n.ID())
	}
	slices.Sort(ids)
	cmd := []string{"cluster", "update", "--config", c.OwnerDir(), "--image", dir, "--drain=false"}
	out, err := ctl.output(ctx, cmd...)
	t.Logf("plinthctl %s:\n%s", strings.Join(cmd, " "), out)
	if err == nil {
		t.Fatal("a rolling update to an image that halts at boot succeeded")
	}
	for _, want := range []string{
		fmt.Sprintf("rolling update stopped at node 1 of 3 (%s)", ids[0]),
		fmt.Sprintf("the update staged on %s is cancelled", ids[1]),
	} {
		if !strings.Contains(out, want) {
			t.Errorf("plinthctl's output does not say %q", want)
		}
	}
	if strings.Contains(out, "[3/3]") {
		t.Error("the rolling update went on to the third node")
	}
	for i, id := range ids {
		// The node pushes its status every few seconds: the second one's
		// may still show the update cancelled a moment ago. Nothing
		// pending is the cancellation plinthctl reported.
		rec, err := c.WaitNode(ctx, c.Node(id), "HEALTHY with nothing pending", func(r *clusterpb.Node) bool {
			return r.GetHealth() == clusterpb.NodeHealth_NODE_HEALTH_HEALTHY && r.GetStatus().GetSoftware() != nil && r.GetStatus().GetSoftware().GetPending() == nil
		})
		if err != nil {
			t.Fatal(err)
		}
		sw := rec.GetStatus().GetSoftware()
		failed := sw.GetLastFailed()
		if rec.GetStatus().GetVersion() != cur.Manifest.Version || sw.GetSlot() != "b" || sw.GetPending() != nil ||
			(i == 0) != (failed != nil) || (i == 0 && !strings.Contains(failed.GetReason(), "did not confirm")) {
			t.Errorf("%s after the failed rolling update: version %s, software %v (want %s in slot b, nothing pending, the failure on the first node only)",
				c.Node(id).Name, rec.GetStatus().GetVersion(), sw, cur.Manifest.Version)
		}
	}
	t.Log(ctl.run(t, "node", "list", "--config", c.OwnerDir()))
}

// rollingUpdate updates every node of c to img with `plinthctl cluster
// update` while a clusterWriter keeps writing through the cluster's
// Management API, and checks what an operator expects of a rolling update:
//   - every node ends on img's version in slot b, HEALTHY, an etcd voter,
//     with no update pending;
//   - no write was lost: every acknowledged write read back as written,
//     and the register ticket at the end is the last one acknowledged;
//   - the cluster answered throughout: writes were acknowledged while
//     each node was down (from its QEMU exiting for the trial boot to its
//     new slot confirmed), so no member's reboot stopped the cluster.
func rollingUpdate(t *testing.T, ctx context.Context, c *launch.Cluster, ctl plinthctl, img *launch.Image, args ...string) {
	t.Helper()
	nodes := c.Nodes()
	w := startClusterWriter(ctx, c)
	// One watcher per node: when its QEMU exits (the reboot into the new
	// slot) and when the new boot confirmed the update.
	type window struct {
		name     string
		down, up time.Time
		err      error
	}
	windows := make([]window, len(nodes))
	var wg sync.WaitGroup
	for i, n := range nodes {
		wg.Go(func() {
			windows[i] = window{name: n.Name}
			windows[i].down, windows[i].up, windows[i].err = rebootWindow(ctx, c, n, img.Manifest.Version)
		})
	}
	cmd := append([]string{"cluster", "update", "--config", c.OwnerDir(), "--image", img.Dir}, args...)
	out, err := ctl.output(ctx, cmd...)
	t.Logf("plinthctl %s:\n%s", strings.Join(cmd, " "), out)
	if err != nil {
		w.stop(ctx)
		t.Fatalf("the rolling update failed: %v", err)
	}
	wg.Wait()
	acked, longest, lost := w.stop(ctx)
	t.Logf("writer: %d writes acknowledged, longest wait for one %v", len(acked), longest.Round(100*time.Millisecond))
	if lost != nil {
		t.Fatalf("a write was lost: %v", lost)
	}
	for _, win := range windows {
		if win.err != nil {
			t.Fatalf("%s: %v", win.name, win.err)
		}
		during := 0
		for _, a := range acked {
			if a.After(win.down) && a.Before(win.up) {
				during++
			}
		}
		t.Logf("%s was down for its update %v; %d writes acknowledged meanwhile", win.name, win.up.Sub(win.down).Round(100*time.Millisecond), during)
		if during == 0 {
			t.Errorf("no write was acknowledged while %s rebooted into its new slot: the cluster did not answer", win.name)
		}
	}
	for _, n := range nodes {
		rec := nodeRecord(t, ctx, c, n.ID())
		sw := rec.GetStatus().GetSoftware()
		if rec.GetStatus().GetVersion() != img.Manifest.Version || sw.GetSlot() != "b" || sw.GetPending() != nil || sw.GetLastFailed() != nil ||
			rec.GetConsensusMembership() != clusterpb.ConsensusMembership_CONSENSUS_MEMBERSHIP_VOTER {
			t.Errorf("%s after the rolling update: version %s, software %v, etcd %s", n.Name, rec.GetStatus().GetVersion(), sw, rec.GetConsensusMembership())
		}
	}
}

// rebootWindow waits for n's current QEMU to exit (down) and then for
// its next boot to report version with no update pending: the trial boot
// confirmed (up, at most a poll after the confirmation).
func rebootWindow(ctx context.Context, c *launch.Cluster, n *launch.ClusterNode, version string) (down, up time.Time, err error) {
	old := n.VM()
	select {
	case <-old.Exited():
	case <-ctx.Done():
		return down, up, fmt.Errorf("never rebooted: %w", ctx.Err())
	}
	down = time.Now()
	for n.VM() == old {
		if supervisor.Sleep(ctx, 100*time.Millisecond) != nil {
			return down, up, fmt.Errorf("never booted again: %w", ctx.Err())
		}
	}
	_, err = c.WaitStatus(ctx, n, version+" confirmed", func(st *clusterpb.StatusResponse) bool {
		return st.GetStatus().GetVersion() == version && st.GetStatus().GetSoftware() != nil && st.GetStatus().GetSoftware().GetPending() == nil
	})
	if err != nil {
		return down, up, fmt.Errorf("the boot after the reboot never confirmed the update: %w", err)
	}
	return down, time.Now(), nil
}

// writeEvery paces the clusterWriter: each write is an etcd commit on
// every member, which under TCG costs the guests CPU the update needs.
const writeEvery = time.Second

// clusterWriter rotates the cluster's register ticket through the owner's
// Management client (which moves on to another curator when one does not
// answer) and reads each new ticket back, until stopped: the writes an
// operator's tooling would make during a rolling update.
type clusterWriter struct {
	c        *launch.Cluster
	stopping atomic.Bool
	done     chan struct{}

	mu      sync.Mutex
	acked   []time.Time // when each write was acknowledged and read back
	last    []byte      // the last acknowledged ticket
	longest time.Duration
	lost    error
}

func startClusterWriter(ctx context.Context, c *launch.Cluster) *clusterWriter {
	w := &clusterWriter{c: c, done: make(chan struct{})}
	go func() {
		defer close(w.done)
		since := time.Now()
		// Stopping waits for an acknowledged write: one that was applied
		// but not acknowledged must not be the last.
		for ok := false; !(ok && w.stopping.Load()) && ctx.Err() == nil; {
			got, tk, err := w.write(ctx)
			ok = err == nil
			w.mu.Lock()
			switch {
			case err != nil:
			case !bytes.Equal(got, tk):
				w.lost = fmt.Errorf("ticket %x… acknowledged, then %x… read back", tk[:4], got[:4])
			default:
				now := time.Now()
				w.longest = max(w.longest, now.Sub(since))
				w.acked, w.last, since = append(w.acked, now), tk, now
			}
			w.mu.Unlock()
			supervisor.Sleep(ctx, writeEvery)
		}
	}()
	return w
}

// write rotates the ticket and reads it back, on whichever curators
// answer; a write not acknowledged within its timeout is not counted.
func (w *clusterWriter) write(ctx context.Context) (got, written []byte, err error) {
	ctx, cancel := context.WithTimeout(ctx, 15*time.Second)
	defer cancel()
	cl := w.c.Client()
	if written, err = cl.RotateTicket(ctx); err != nil {
		return nil, nil, err
	}
	for {
		if got, err = cl.Ticket(ctx); err == nil {
			return got, written, nil
		}
		if supervisor.Sleep(ctx, 200*time.Millisecond) != nil {
			return nil, nil, err
		}
	}
}

// readTicket reads the ticket, asking again for a minute while no
// curator answers.
func (w *clusterWriter) readTicket(ctx context.Context) ([]byte, error) {
	ctx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	for {
		cctx, ccancel := context.WithTimeout(ctx, 15*time.Second)
		got, err := w.c.Client().Ticket(cctx)
		ccancel()
		if err == nil || supervisor.Sleep(ctx, time.Second) != nil {
			return got, err
		}
	}
}

// stop lets the writer finish with an acknowledged write, stops the writer and checks that
// the cluster holds the last acknowledged write. It returns when each
// write was acknowledged, the longest wait for one, and a lost write.
func (w *clusterWriter) stop(ctx context.Context) (acked []time.Time, longest time.Duration, lost error) {
	w.stopping.Store(true)
	<-w.done
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.lost == nil && w.last != nil {
		// A curator that does not answer at this moment (a leader
		// election after the last reboot) loses nothing: ask again.
		got, err := w.readTicket(ctx)
		switch {
		case err != nil:
			w.lost = fmt.Errorf("reading the ticket at the end: %w", err)
		case !bytes.Equal(got, w.last):
			w.lost = fmt.Errorf("the last acknowledged ticket is %x…, the cluster has %x…", w.last[:4], got[:4])
		}
	}
	return w.acked, w.longest, w.lost
}
