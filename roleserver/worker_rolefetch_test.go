package roleserver

import (
	"context"
	"errors"
	"os"
	"sync/atomic"
	"testing"
	"time"

	"google.golang.org/protobuf/proto"

	"plinth.dev/plinth/api/clusterpb"
)

// TestRolesWriteFailure: roles the curator sends are followed even when
// they cannot be saved, the write is retried, and the node's status says
// so until it succeeds.
func TestRolesWriteFailure(t *testing.T) {
	n := newTestNode(t)
	var failing atomic.Bool
	failing.Store(true)
	n.knobs.saveRoles = func(*clusterpb.NodeRoles) error {
		if failing.Load() {
			return errors.New("no space left on device")
		}
		return nil
	}
	n.knobs.retryInterval = 50 * time.Millisecond
	n.start()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	n.svc.loadRoles()
	roles := &clusterpb.NodeRoles{KubernetesWorker: &clusterpb.NodeRoles_KubernetesWorker{}}
	// The rolefetch worker's setRoles and retries, on the Service's state
	// (as Run wires them).
	rf := &workerRoleFetch{roles: &n.svc.Roles, rolesFile: &n.svc.rolesFile, clusterKey: &n.svc.clusterKey}
	go rf.rolesFile.retry(ctx)
	rf.setRoles(ctx, roles)
	if !proto.Equal(get(&n.svc.Roles), roles) {
		t.Fatal("roles not followed")
	}
	if p := n.svc.status(n.sup.Load().Snapshot()).GetProblems(); len(p) != 1 || p[0].GetComponent() != "roles" {
		t.Fatalf("status problems %v, want the roles write", p)
	}
	if _, err := n.root.Data.Node.Roles.Read(); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("roles file: %v", err)
	}
	failing.Store(false)
	eventually(t, 10*time.Second, "roles saved by the retry", func() error {
		b, err := n.root.Data.Node.Roles.Read()
		if err != nil {
			return err
		}
		got := &clusterpb.NodeRoles{}
		if err := proto.Unmarshal(b, got); err != nil || !proto.Equal(got, roles) {
			return errString("not the roles")
		}
		if len(n.svc.status(n.sup.Load().Snapshot()).GetProblems()) != 0 {
			return errString("problem still reported")
		}
		return nil
	})
}
