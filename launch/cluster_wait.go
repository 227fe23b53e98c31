package launch

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/status"

	"plinth.dev/plinth/api/clusterpb"
	"plinth.dev/plinth/platform/supervisor"
	"plinth.dev/plinth/roleserver/identity"
	"plinth.dev/plinth/roleserver/rpc"
)

// Waiting on a cluster. The harness and the cluster tests wait on the
// typed state the cluster's and the nodes' own APIs report, polled every
// retryInterval:
//
//	WaitNode    Management.GetNodes: the curator's record of a node (state,
//	            health, roles, etcd membership, and the status the node
//	            last pushed: version, boot count, slot and updates)
//	WaitStatus  NodeManagement.Status of the node itself: its live status
//	            (the same fields, as of now rather than of its last push)
//	            and its supervisor's runnables (what its roles make it run)
//
// Both go through retry, which gives up when the node powers off instead
// of rebooting, and names the last state seen. Log lines are no
// interface: a wait for "roles changed" breaks when a message is
// reworded or a worker renamed, and cannot say what the node's state was
// instead. The console stays the channel only where it is the product's:
// what /init says about a boot (its steps, a halted node's reason), the
// CA fingerprint the bootstrap node prints for its owner, and what a
// node says as it registers, is refused, or opens its data volume (no
// API the owner can ask answers for those).

// retriable are the errors of a cluster that is still coming up.
func retriable(err error) bool {
	switch status.Code(err) {
	case codes.Unavailable, codes.DeadlineExceeded, codes.FailedPrecondition:
		return true
	}
	return false
}

// retryInterval is how long retry waits between tries: a try is a
// cheap RPC, and in a serial test every second of waiting is a second of
// make test.
const retryInterval = time.Second

// retry calls fn until it succeeds, fails for good, n's QEMU exits, or
// StepTimeout passes.
func (c *Cluster) retry(ctx context.Context, n *ClusterNode, what string, fn func(context.Context) error) error {
	ctx, cancel := context.WithTimeout(ctx, c.opts.StepTimeout)
	defer cancel()
	for {
		actx, acancel := context.WithTimeout(ctx, 30*time.Second)
		err := fn(actx)
		acancel()
		if err == nil {
			return nil
		}
		if !retriable(err) {
			return fmt.Errorf("launch: %s: %s: %w", n.Name, what, err)
		}
		vm := n.VM()
		select {
		case <-vm.Exited():
			// A reboot is followed by the next boot (see watch).
			if !slices.ContainsFunc(vm.Lines(), rebootLine.MatchString) {
				return fmt.Errorf("launch: %s: %s: node exited (%s); last console lines:\n%s", n.Name, what, vm.ExitStatus(), vm.Tail())
			}
			if supervisor.Sleep(ctx, 2*time.Second) != nil {
				return fmt.Errorf("launch: %s: %s: %w (last error: %v)", n.Name, what, ctx.Err(), err)
			}
		case <-ctx.Done():
			return fmt.Errorf("launch: %s: %s: %w (last error: %v)", n.Name, what, ctx.Err(), err)
		case <-time.After(retryInterval):
		}
	}
}

// WaitNode waits for the cluster to list n (by address, or by its known
// ID) in a record for which ok holds.
func (c *Cluster) WaitNode(ctx context.Context, n *ClusterNode, what string, ok func(*clusterpb.Node) bool) (*clusterpb.Node, error) {
	var found *clusterpb.Node
	err := c.retry(ctx, n, "waiting to be "+what, func(ctx context.Context) error {
		nodes, err := c.Client().Nodes(ctx)
		if err != nil {
			return err
		}
		rec := c.match(n, nodes)
		if rec == nil || !ok(rec) {
			return status.Errorf(codes.Unavailable, "%s not %s yet (node record %v)", n.Name, what, rec)
		}
		found = rec
		return nil
	})
	return found, err
}

// WaitStatus waits until n's own status (nodeStatus) is one for which ok
// holds.
func (c *Cluster) WaitStatus(ctx context.Context, n *ClusterNode, what string, ok func(*clusterpb.StatusResponse) bool) (*clusterpb.StatusResponse, error) {
	var found *clusterpb.StatusResponse
	err := c.retry(ctx, n, "waiting for its status to show "+what, func(ctx context.Context) error {
		st, err := c.nodeStatus(ctx, n)
		if err != nil {
			return err
		}
		if !ok(st) {
			return status.Errorf(codes.Unavailable, "%s shows no %s yet (%s)", n.Name, what, statusSummary(st))
		}
		found = st
		return nil
	})
	return found, err
}

// statusSummary is what a failed WaitStatus shows of the last status:
// the node's own fields and its runnables' states, not their processes.
func statusSummary(st *clusterpb.StatusResponse) string {
	s := st.GetStatus()
	var rs []string
	for _, r := range st.GetRunnables() {
		rs = append(rs, r.GetDn()+"="+r.GetState())
	}
	return fmt.Sprintf("version %s, boot %d, software {%v}, runnables %s", s.GetVersion(), s.GetBootCount(), s.GetSoftware(), strings.Join(rs, " "))
}

// HasRunnable reports whether st lists the supervisor runnable dn: a
// role's runnables are there while the node runs the role.
func HasRunnable(st *clusterpb.StatusResponse, dn string) bool {
	return slices.ContainsFunc(st.GetRunnables(), func(r *clusterpb.RunnableStatus) bool { return r.GetDn() == dn })
}

// nodeStatus asks n's NodeManagement for its status and runnables, on a
// connection of its own, closed after: the owner client keeps one per
// node, whose reconnects back off up to two minutes while the node
// reboots, and a poll for its return would wait that out.
func (c *Cluster) nodeStatus(ctx context.Context, n *ClusterNode) (*clusterpb.StatusResponse, error) {
	cc, err := c.Dial(c.NodeManagementEndpoint(n), identity.ServerNode, n.ID(), rpc.ClientConnectParams())
	if err != nil {
		return nil, err
	}
	defer cc.Close()
	return clusterpb.NewNodeManagementClient(cc).Status(ctx, &clusterpb.StatusRequest{})
}

// Dial connects to a forwarded endpoint with the owner's credentials, to
// a server of role; node, if set, is the node ID that must answer (the
// TLS server name, which the credentials' check pins).
func (c *Cluster) Dial(endpoint string, role identity.ServerRole, node string, opts ...grpc.DialOption) (*grpc.ClientConn, error) {
	c.mu.Lock()
	cfg := c.cfg
	c.mu.Unlock()
	if cfg == nil {
		return nil, fmt.Errorf("launch: %s: the harness does not own the cluster yet", endpoint)
	}
	tlsCfg := cfg.Credentials.ClientTLSConfig(role)
	tlsCfg.ServerName = node
	opts = append([]grpc.DialOption{grpc.WithTransportCredentials(credentials.NewTLS(tlsCfg)), rpc.ClientKeepalive()}, opts...)
	return grpc.NewClient("passthrough:///"+endpoint, opts...)
}
