package consensus

import (
	"testing"

	clientv3 "go.etcd.io/etcd/client/v3"

	"plinth.dev/plinth/platform/event"
	"plinth.dev/plinth/platform/event/memory"
)

type testServiceHandle struct {
	value memory.Value[*Status]
}

func (h *testServiceHandle) Watch() event.Watcher[*Status] { return h.value.Watch() }

// serviceHandleOf builds a ServiceHandle around a bare etcd client (a
// real one, clientv3.New: its namespaced clients need gRPC connections
// for their watches and leases), for tests of code that expects the
// consensus service.
func serviceHandleOf(t *testing.T, cl *clientv3.Client) ServiceHandle {
	t.Helper()
	h := &testServiceHandle{}
	h.value.Set(&Status{running: true, be: newClientBackend(cl)})
	return h
}

// newClientBackend uses a real client, which stays the caller's: closing
// the backend does not close it.
func newClientBackend(cl *clientv3.Client) *backend {
	ep := ""
	if eps := cl.Endpoints(); len(eps) > 0 {
		ep = eps[0]
	}
	return &backend{
		KV:             cl.KV,
		Cluster:        cl.Cluster,
		Maintenance:    cl.Maintenance,
		newWatcher:     func() clientv3.Watcher { return clientv3.NewWatcher(cl) },
		newLease:       func() clientv3.Lease { return clientv3.NewLease(cl) },
		statusEndpoint: ep,
		done:           cl.Ctx().Done(),
		closer:         func() error { return nil },
	}
}
