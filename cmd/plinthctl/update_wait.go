package main

import (
	"context"
	"fmt"
	"io"
	"strings"
	"time"

	"google.golang.org/protobuf/proto"

	"plinth.dev/plinth/api/clusterpb"
	"plinth.dev/plinth/roleserver/owner"
)

// statusPoll is how often plinthctl asks about a node it waits for.
const statusPoll = time.Second

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
		case <-time.After(statusPoll):
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
		return nil, fmt.Errorf("%s is a Kubernetes worker and cannot be drained (--drain=false updates it anyway): %w", id, err)
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
		case <-time.After(statusPoll):
		}
	}
}

func pendingText(p *clusterpb.PendingUpdate) string {
	if p == nil {
		return "no update pending"
	}
	return fmt.Sprintf("update to %s in slot %s %s", p.GetVersion(), p.GetSlot(), p.GetPhase())
}
