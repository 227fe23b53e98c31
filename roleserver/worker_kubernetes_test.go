package roleserver

import (
	"context"
	"net"
	"sync"
	"testing"
	"time"

	"plinth.dev/plinth/api/clusterpb"
	"plinth.dev/plinth/platform/logtree"
	"plinth.dev/plinth/platform/supervisor"
	"plinth.dev/plinth/roleserver/consensus"
)

// fakeRunnables records which fake Kubernetes runnables run.
type fakeRunnables struct {
	mu      sync.Mutex
	running map[string]bool
	starts  map[string]int
}

func (f *fakeRunnables) runnable(name string) supervisor.Runnable {
	return func(ctx context.Context) error {
		f.mu.Lock()
		f.running[name] = true
		f.starts[name]++
		f.mu.Unlock()
		supervisor.Signal(ctx, supervisor.SignalHealthy)
		<-ctx.Done()
		f.mu.Lock()
		f.running[name] = false
		f.mu.Unlock()
		return ctx.Err()
	}
}

func (f *fakeRunnables) state() (controller, worker bool) {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.running["controller"], f.running["worker"]
}

// TestKubernetesRolesStartAndStop: the Kubernetes runnables follow the
// node's roles: the worker starts with KubernetesWorker and stops when
// the role goes (the node goes NotReady), comes back with it; the
// controller needs a running consensus member.
func TestKubernetesRolesStartAndStop(t *testing.T) {
	s := New(Config{StorageRoot: nil})
	f := &fakeRunnables{running: map[string]bool{}, starts: map[string]int{}}
	w := &workerKubernetes{
		node: &s.node, roles: &s.Roles, controlPlane: &s.ControlPlane, curator: &s.CuratorConnection,
		controllers: &s.kubernetesControllers, status: &s.KubernetesStatus,
		address:       func(context.Context) (net.IP, error) { return net.ParseIP("10.42.0.10"), nil },
		runController: func(string, net.IP, *consensus.Status) supervisor.Runnable { return f.runnable("controller") },
		runWorker: func(string, net.IP, *CuratorConnection) (supervisor.Runnable, reportStopped) {
			return f.runnable("worker"), func(_ context.Context, servers []string) error {
				f.mu.Lock()
				defer f.mu.Unlock()
				if f.running["worker"] {
					t.Error("the worker reported stopped while it runs")
				}
				if len(servers) != 1 || servers[0] != "10.42.0.10:6443" {
					t.Errorf("stopped worker reported to %q, want the cluster's API servers", servers)
				}
				f.starts["reportStopped"]++
				return nil
			}
		},
		stopPods: func() (int, error) {
			f.mu.Lock()
			defer f.mu.Unlock()
			if f.running["worker"] {
				t.Error("pods stopped while the worker runs")
			}
			f.starts["stopPods"]++
			return 0, nil
		},
	}
	s.node.Set(&nodeData{nodeID: "plinth-x"})
	s.kubernetesControllers.Set([]string{"10.42.0.10:6443"})
	s.CuratorConnection.Set(&CuratorConnection{})
	s.Roles.Set(&clusterpb.NodeRoles{})
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	sup := supervisor.New(ctx, logtree.New(1000), func(ctx context.Context) error {
		if err := supervisor.Run(ctx, "kubernetes", w.run); err != nil {
			return err
		}
		supervisor.Signal(ctx, supervisor.SignalHealthy)
		<-ctx.Done()
		return ctx.Err()
	}, supervisor.Options{InitialBackoff: 10 * time.Millisecond})
	defer sup.Wait()
	defer cancel()
	want := func(what string, controller, worker bool) {
		t.Helper()
		deadline := time.Now().Add(10 * time.Second)
		for {
			c, wk := f.state()
			if c == controller && wk == worker {
				return
			}
			if time.Now().After(deadline) {
				t.Fatalf("%s: controller running %v, worker running %v; want %v, %v", what, c, wk, controller, worker)
			}
			time.Sleep(10 * time.Millisecond)
		}
	}
	worker := &clusterpb.NodeRoles_KubernetesWorker{}
	want("no roles", false, false)
	s.Roles.Set(&clusterpb.NodeRoles{KubernetesWorker: worker})
	want("worker role", false, true)
	f.mu.Lock()
	stopsBefore, reportsBefore := f.starts["stopPods"], f.starts["reportStopped"]
	f.mu.Unlock()
	if reportsBefore != 0 {
		t.Fatalf("%d reports of a stopped worker before any worker stopped", reportsBefore)
	}
	s.Roles.Set(&clusterpb.NodeRoles{})
	want("worker role removed", false, false)
	deadline := time.Now().Add(10 * time.Second)
	for {
		f.mu.Lock()
		stops, reports := f.starts["stopPods"], f.starts["reportStopped"]
		f.mu.Unlock()
		if stops > stopsBefore && reports == 1 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the worker role went: pods stopped %d times (want more than %d), reported %d times (want 1)", stops, stopsBefore, reports)
		}
		time.Sleep(10 * time.Millisecond)
	}
	s.Roles.Set(&clusterpb.NodeRoles{KubernetesWorker: worker})
	want("worker role back", false, true)
	// The controller waits for the node's consensus member.
	s.Roles.Set(&clusterpb.NodeRoles{KubernetesWorker: worker, ConsensusMember: &clusterpb.NodeRoles_ConsensusMember{},
		KubernetesController: &clusterpb.NodeRoles_KubernetesController{}})
	time.Sleep(200 * time.Millisecond)
	if c, _ := f.state(); c {
		t.Fatal("controller runs without a consensus member")
	}
	f.mu.Lock()
	starts := f.starts["worker"]
	f.mu.Unlock()
	if starts < 2 {
		t.Fatalf("worker started %d times, want a restart per role change", starts)
	}
}
