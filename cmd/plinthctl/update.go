package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"slices"
	"strings"
	"time"

	"google.golang.org/protobuf/proto"

	"plinth.dev/plinth/api/clusterpb"
	"plinth.dev/plinth/roleserver/owner"
)

func init() {
	register("update", "install a new image on a node (A/B), or on every node one at a time", func() verb { return new(updateCmd) })
}

// updateCmd is `plinthctl update NODE -image DIR` and `plinthctl update
// -all -image DIR`.
type updateCmd struct {
	config   string
	image    string
	all      bool
	noReboot bool
	timeout  time.Duration
	// drain: Kubernetes workers are cordoned and drained first (through
	// kubeServer, host:port, if set) and uncordoned after.
	drain      bool
	kubeServer string
}

const updateUsage = "usage: plinthctl update (NODE | -all) -image DIR [-no-reboot] [-timeout D]"

func (c *updateCmd) flags(fs *flag.FlagSet) {
	configFlagVar(fs, &c.config)
	fs.StringVar(&c.image, "image", "", "image `dir`ectory (the builder's output: manifest.json, system.img, UKIs)")
	fs.BoolVar(&c.all, "all", false, "update every node, one at a time, each healthy on the new version before the next")
	fs.BoolVar(&c.noReboot, "no-reboot", false, "install only: the node boots the new slot at its next reboot")
	fs.DurationVar(&c.timeout, "timeout", 20*time.Minute, "how long to wait for a node to come back healthy on the new version")
	fs.BoolVar(&c.drain, "drain", true, "cordon and drain a Kubernetes worker before its update (its pods move to other workers), uncordon it after")
	fs.StringVar(&c.kubeServer, "kube-server", "", "Kubernetes API server `host:port` for -drain (default: the first the cluster names)")
}

func (c *updateCmd) run(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs := newFlagSet("update", stderr)
	c.flags(fs)
	pos, err := parseArgs(fs, args)
	if err != nil {
		return err
	}
	if c.image == "" || (len(pos) == 1) == c.all || len(pos) > 1 {
		return errors.New(updateUsage)
	}
	if c.all && c.noReboot {
		return errors.New("-all updates one node after another and needs each to reboot: it cannot be combined with -no-reboot")
	}
	img, err := owner.ReadUpdateImage(c.image)
	if err != nil {
		return err
	}
	cl, err := dialOwner(c.config)
	if err != nil {
		return err
	}
	defer cl.Close()
	var ids []string
	if c.all {
		if ids, err = updateOrder(ctx, cl); err != nil {
			return err
		}
	} else {
		id, err := nodeID(ctx, cl, pos[0])
		if err != nil {
			return err
		}
		ids = []string{id}
	}
	for i, id := range ids {
		if len(ids) > 1 {
			fmt.Fprintf(stdout, "[%d/%d] %s\n", i+1, len(ids), id)
		}
		if err := c.updateNode(ctx, cl, id, img, stdout); err != nil {
			if len(ids) > 1 {
				return fmt.Errorf("rolling update stopped at node %d of %d (%s); the nodes before it run %s, the nodes after it were not touched: %w", i+1, len(ids), id, img.Version, err)
			}
			return err
		}
	}
	return nil
}

// updateOrder is the order of a rolling update: nodes that are not
// consensus members first, then the members, so the quorum is touched
// last and one member at a time.
func updateOrder(ctx context.Context, cl *owner.Client) ([]string, error) {
	ctx, cancel := context.WithTimeout(ctx, callTimeout)
	defer cancel()
	nodes, err := cl.Nodes(ctx)
	if err != nil {
		return nil, err
	}
	var workers, members []string
	for _, n := range nodes {
		if n.GetState() != clusterpb.NodeState_NODE_STATE_UP {
			continue
		}
		if n.GetRoles().GetConsensusMember() != nil {
			members = append(members, n.GetId())
		} else {
			workers = append(workers, n.GetId())
		}
	}
	slices.Sort(workers)
	slices.Sort(members)
	return append(workers, members...), nil
}

// updateNode installs img on id and, unless -no-reboot, waits until it is
// back, healthy, on the new version (and a voting consensus member again
// if it was one).
func (c *updateCmd) updateNode(ctx context.Context, cl *owner.Client, id string, img *owner.UpdateImage, stdout io.Writer) error {
	before, err := cl.FindNode(ctx, id)
	if err != nil {
		return err
	}
	var kube *owner.KubeAPI
	if c.drain && !c.noReboot && before.GetRoles().GetKubernetesWorker() != nil {
		if kube, err = c.cordonAndDrain(ctx, cl, id, stdout); err != nil {
			return err
		}
	}
	started := time.Now()
	var last time.Time
	var lastPhase string
	done, err := cl.Update(ctx, id, img, !c.noReboot, func(p *clusterpb.UpdateProgress) {
		if p.GetPhase() == lastPhase && time.Since(last) < 2*time.Second && p.GetDoneBytes() != p.GetTotalBytes() {
			return
		}
		lastPhase, last = p.GetPhase(), time.Now()
		if p.GetTotalBytes() > 0 && p.GetDoneBytes() > 0 {
			fmt.Fprintf(stdout, "  %s: %d/%d MiB\n", p.GetPhase(), p.GetDoneBytes()>>20, p.GetTotalBytes()>>20)
		} else {
			fmt.Fprintf(stdout, "  %s\n", p.GetPhase())
		}
	})
	if err != nil {
		// Refused or abandoned: the node runs its slot as before and may
		// run pods again.
		if kube != nil {
			err = errors.Join(err, kube.Cordon(ctx, id, false))
		}
		return fmt.Errorf("update of %s: %w", id, err)
	}
	fmt.Fprintf(stdout, "  %s installed in slot %s in %s\n", done.GetVersion(), done.GetSlot(), time.Since(started).Round(time.Second))
	if !done.GetRebooting() {
		fmt.Fprintf(stdout, "  the node boots it once at its next reboot, and keeps it when healthy\n")
		return nil
	}
	voter := before.GetConsensusMembership() == clusterpb.ConsensusMembership_CONSENSUS_MEMBERSHIP_VOTER
	err = waitUpdated(ctx, cl, id, done, voter, before.GetStatus().GetSoftware().GetLastFailed(), started, c.timeout, stdout)
	// Back and healthy, on the new slot or (a failed update) the old one:
	// it may run pods again.
	var failed *updateFailedError
	if kube != nil && err == nil {
		// Its kubelet, of the new image, must be back before its pods
		// are: else the next worker's would have nowhere to go.
		if err := waitKubernetesReady(ctx, kube, id, c.timeout, stdout); err != nil {
			return err
		}
	}
	if kube != nil && (err == nil || errors.As(err, &failed)) {
		if uerr := kube.Cordon(ctx, id, false); uerr != nil {
			return errors.Join(err, fmt.Errorf("uncordoning %s: %w", id, uerr))
		}
		fmt.Fprintf(stdout, "  uncordoned\n")
	}
	return err
}

// waitKubernetesReady waits until Kubernetes reports node id Ready.
func waitKubernetesReady(ctx context.Context, kube *owner.KubeAPI, id string, timeout time.Duration, stdout io.Writer) error {
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	for {
		ready, reason, err := kube.NodeReady(ctx, id)
		if ready {
			fmt.Fprintf(stdout, "  Kubernetes node Ready\n")
			return nil
		}
		if err != nil {
			reason = err.Error()
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("%s runs the new image, but its Kubernetes node is not Ready after %v (%s): it stays cordoned", id, timeout, reason)
		case <-time.After(2 * time.Second):
		}
	}
}

// drainTimeout bounds the wait for a worker's pods to leave.
const drainTimeout = 5 * time.Minute

// cordonAndDrain takes Kubernetes worker id out of service: no new pods,
// its pods evicted (PodDisruptionBudgets honoured).
func (c *updateCmd) cordonAndDrain(ctx context.Context, cl *owner.Client, id string, stdout io.Writer) (*owner.KubeAPI, error) {
	kube, err := cl.KubeAPI(ctx, c.kubeServer)
	if err != nil {
		return nil, fmt.Errorf("%s is a Kubernetes worker and cannot be drained (-drain=false updates it anyway): %w", id, err)
	}
	if err := kube.Cordon(ctx, id, true); err != nil {
		return nil, err
	}
	dctx, cancel := context.WithTimeout(ctx, drainTimeout)
	defer cancel()
	n, err := kube.Drain(dctx, id)
	if err != nil {
		return nil, fmt.Errorf("draining %s (it stays cordoned): %w", id, err)
	}
	fmt.Fprintf(stdout, "  cordoned, %d pods evicted\n", n)
	return kube, nil
}

// updateFailedError: the node recorded the update's failure and runs its
// old slot again.
type updateFailedError struct{ msg string }

func (e *updateFailedError) Error() string { return e.msg }

// waitUpdated waits until node id runs done's version from done's slot
// with nothing pending, healthy (and a voter, if voter), or reports the
// update's failure the node recorded (a failure other than earlier, the
// one it reported before this update).
func waitUpdated(ctx context.Context, cl *owner.Client, id string, done *clusterpb.UpdateDone, voter bool, earlier *clusterpb.FailedUpdate, since time.Time, timeout time.Duration, stdout io.Writer) error {
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	fmt.Fprintf(stdout, "  rebooting into slot %s; waiting for it to be healthy\n", done.GetSlot())
	var said string
	for {
		pctx, pcancel := context.WithTimeout(ctx, 10*time.Second)
		n, err := cl.FindNode(pctx, id)
		pcancel()
		var state string
		if err == nil {
			st, sw := n.GetStatus(), n.GetStatus().GetSoftware()
			if f := sw.GetLastFailed(); f != nil && !proto.Equal(f, earlier) {
				return &updateFailedError{fmt.Sprintf("the update of %s to %s failed, the node runs slot %s (%s) again: %s", id, done.GetVersion(), sw.GetSlot(), st.GetVersion(), f.GetReason())}
			}
			ok := st.GetVersion() == done.GetVersion() && sw.GetSlot() == done.GetSlot() && sw.GetPending() == nil &&
				n.GetHealth() == clusterpb.NodeHealth_NODE_HEALTH_HEALTHY &&
				(!voter || n.GetConsensusMembership() == clusterpb.ConsensusMembership_CONSENSUS_MEMBERSHIP_VOTER)
			if ok {
				fmt.Fprintf(stdout, "  %s runs %s from slot %s, healthy, after %s\n", id, st.GetVersion(), sw.GetSlot(), time.Since(since).Round(time.Second))
				return nil
			}
			state = fmt.Sprintf("version %s, slot %s, %s, %s", st.GetVersion(), sw.GetSlot(), pendingText(sw.GetPending()), strings.ToLower(strings.TrimPrefix(n.GetHealth().String(), "NODE_HEALTH_")))
			if voter {
				state += ", " + strings.ToLower(strings.TrimPrefix(n.GetConsensusMembership().String(), "CONSENSUS_MEMBERSHIP_"))
			}
		} else {
			state = "cluster unreachable: " + err.Error()
		}
		if state != said {
			fmt.Fprintf(stdout, "  [%s] %s\n", time.Since(since).Round(time.Second), state)
			said = state
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("%s did not come back healthy on %s within %s (last seen: %s)", id, done.GetVersion(), timeout, said)
		case <-time.After(2 * time.Second):
		}
	}
}

func pendingText(p *clusterpb.PendingUpdate) string {
	if p == nil {
		return "no update pending"
	}
	return fmt.Sprintf("update to %s in slot %s %s", p.GetVersion(), p.GetSlot(), p.GetPhase())
}
