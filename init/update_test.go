package main

import (
	"testing"

	"plinth.dev/plinth/platform/supervisor"
)

func TestPlatformReady(t *testing.T) {
	st := func(dn string, s supervisor.State) supervisor.Status { return supervisor.Status{DN: dn, State: s} }
	member := []supervisor.Status{
		st("root", supervisor.StateHealthy),
		st("root.enrolment", supervisor.StateDone),
		st("root.roleserver", supervisor.StateHealthy),
		st("root.roleserver.controlplane.consensus", supervisor.StateHealthy),
		st("root.roleserver.heartbeat", supervisor.StateHealthy),
		st("root.roleserver.kubernetes", supervisor.StateHealthy),
	}
	for _, c := range []struct {
		name  string
		extra []supervisor.Status
		want  bool
	}{
		{"all healthy", nil, true},
		{"a worker waiting for API servers", []supervisor.Status{st("root.roleserver.kubernetes.worker", supervisor.StateStarting)}, true},
		{"etcd not up", []supervisor.Status{st("root.roleserver.controlplane.consensus.crl", supervisor.StateStarting)}, false},
		{"no heartbeat", []supervisor.Status{st("root.roleserver.heartbeat", supervisor.StateBackoff)}, false},
	} {
		sts := append(append([]supervisor.Status(nil), member...), c.extra...)
		if got := platformReady(sts); got != c.want {
			t.Errorf("%s: platformReady = %v, want %v", c.name, got, c.want)
		}
	}
	if platformReady(nil) {
		t.Error("an empty tree is not ready")
	}
}
