package main

import (
	"bytes"
	"strings"
	"testing"
	"time"

	"plinth.dev/plinth/api/clusterpb"
)

func TestNodeTable(t *testing.T) {
	now := time.Unix(1000, 0)
	nodes := []*clusterpb.Node{
		{
			Id: "plinth-aaaa", State: clusterpb.NodeState_NODE_STATE_UP, Health: clusterpb.NodeHealth_NODE_HEALTH_HEALTHY,
			Status: &clusterpb.NodeStatus{Addresses: []string{"10.42.0.10", "10.42.0.99"}, Version: "v2",
				Software: &clusterpb.NodeSoftware{Slot: "b", LastFailed: &clusterpb.FailedUpdate{Version: "v3"}}},
			Roles:                  &clusterpb.NodeRoles{ConsensusMember: &clusterpb.NodeRoles_ConsensusMember{}, KubernetesWorker: &clusterpb.NodeRoles_KubernetesWorker{}},
			LastHeartbeatUnixNanos: now.Add(-3 * time.Second).UnixNano(),
			ConsensusMembership:    clusterpb.ConsensusMembership_CONSENSUS_MEMBERSHIP_VOTER,
		},
		{Id: "plinth-bbbb", State: clusterpb.NodeState_NODE_STATE_NEW, Status: &clusterpb.NodeStatus{Version: "v1",
			Software: &clusterpb.NodeSoftware{Slot: "a", Pending: &clusterpb.PendingUpdate{Version: "v2", Slot: "b", Phase: "ready"}}}},
		{Id: "plinth-cccc", State: clusterpb.NodeState_NODE_STATE_UP, ConsensusMemberPending: true,
			ConsensusMembership: clusterpb.ConsensusMembership_CONSENSUS_MEMBERSHIP_NONE},
	}
	var b bytes.Buffer
	if err := printNodeTable(&b, nodes, now); err != nil {
		t.Fatal(err)
	}
	want := `ID           STATE  HEALTH   ADDRESS     ROLES                               ETCD     VERSION            LAST SEEN
plinth-aaaa  UP     HEALTHY  10.42.0.10  consensus-member,kubernetes-worker  voter    v2 (b), v3 failed  3s ago
plinth-bbbb  NEW    -        -           -                                   -        v1 (a) → v2 ready  never
plinth-cccc  UP     -        -           -                                   pending  -                  never
`
	if b.String() != want {
		t.Errorf("table:\n%s\nwant:\n%s", b.String(), want)
	}
	b.Reset()
	if err := printJSON(&b, nodes, true); err != nil {
		t.Fatal(err)
	}
	if s := b.String(); !strings.HasPrefix(s, "[\n") || !strings.Contains(s, `"id":`) || strings.Count(s, `"plinth-`) != 3 {
		t.Errorf("json:\n%s", s)
	}
}

func TestPendingTable(t *testing.T) {
	nodes := []*clusterpb.Node{{
		Id: "plinth-aaaa", PublicKey: []byte{0xab, 0xcd}, TpmUsage: clusterpb.NodeTPMUsage_NODE_TPM_USAGE_USED,
		Status: &clusterpb.NodeStatus{Addresses: []string{"10.42.0.10", "10.42.0.99"}},
	}}
	var b bytes.Buffer
	if err := printPendingTable(&b, nodes); err != nil {
		t.Fatal(err)
	}
	want := "ID           PUBLIC KEY  ADDRESS                TPM\nplinth-aaaa  abcd        10.42.0.10,10.42.0.99  USED\n"
	if b.String() != want {
		t.Errorf("table:\n%q\nwant:\n%q", b.String(), want)
	}
}

func TestDescribeNode(t *testing.T) {
	now := time.Unix(1000, 0)
	n := &clusterpb.Node{
		Id: "plinth-aaaa", PublicKey: []byte{1, 2}, State: clusterpb.NodeState_NODE_STATE_UP,
		Status: &clusterpb.NodeStatus{Addresses: []string{"10.42.0.10"}, Version: "v1", BootCount: 3, BootTimeUnixNanos: time.Unix(0, 0).UnixNano() + 1,
			Problems: []*clusterpb.NodeProblem{{Component: "roles", Message: "saving roles failed", SinceUnixNanos: time.Unix(60, 0).UnixNano()}}},
		ConsensusMembership: clusterpb.ConsensusMembership_CONSENSUS_MEMBERSHIP_VOTER,
		Roles: &clusterpb.NodeRoles{ConsensusMember: &clusterpb.NodeRoles_ConsensusMember{
			Peers: []*clusterpb.NodeRoles_ConsensusMember_Peer{{Name: "plinth-bbbb", Url: "https://plinth-bbbb:7834"}},
		}},
	}
	var b bytes.Buffer
	describeNode(&b, n, now)
	want := `ID:          plinth-aaaa
Public key:  0102
State:       UP
Health:      - (last heartbeat never)
TPM:         UNSPECIFIED
Addresses:   10.42.0.10
Version:     v1
Boot count:  3
Booted at:   1970-01-01T00:00:00Z
Roles:       consensus-member
etcd:        voter
Problem:     roles: saving roles failed (since 1970-01-01T00:01:00Z)
  consensus peer plinth-bbbb https://plinth-bbbb:7834
`
	if b.String() != want {
		t.Errorf("describe:\n%s\nwant:\n%s", b.String(), want)
	}
}

func TestFormatLogEntry(t *testing.T) {
	e := &clusterpb.LogEntry{TimeUnixNanos: time.Date(2025, 1, 2, 3, 4, 5, 6000, time.Local).UnixNano(), Level: "INFO",
		Dn: "root.network", Message: "configured address", Attributes: []string{"address=10.42.0.10/24"}}
	if got, want := formatLogEntry(e), "2025-01-02 03:04:05.000006 I root.network: configured address address=10.42.0.10/24"; got != want {
		t.Errorf("got  %q\nwant %q", got, want)
	}
}

func TestRunnablesTable(t *testing.T) {
	rs := []*clusterpb.RunnableStatus{
		{Dn: "root", State: "HEALTHY", Process: &clusterpb.ProcessUsage{Pid: 1, CpuSeconds: 12.34, RssBytes: 50 << 20, PeakRssBytes: 60 << 20}},
		{Dn: "root.network", State: "HEALTHY"},
		{Dn: "root.roleserver.kubernetes.worker.kubelet", State: "BACKOFF", Restarts: 3, LastError: "/usr/bin/kube: exit status 1"},
	}
	var b bytes.Buffer
	if err := printRunnables(&b, rs, false); err != nil {
		t.Fatal(err)
	}
	want := `RUNNABLE                                   STATE    RESTARTS  PID  CPU    RSS      PEAK RSS  LAST ERROR
root                                       HEALTHY  0         1    12.3s  50.0MiB  60.0MiB   -
root.roleserver.kubernetes.worker.kubelet  BACKOFF  3         -    -      -        -         /usr/bin/kube: exit status 1
`
	if b.String() != want {
		t.Errorf("table:\n%s\nwant:\n%s", b.String(), want)
	}
	b.Reset()
	printRunnables(&b, rs, true)
	if !strings.Contains(b.String(), "root.network") {
		t.Errorf("-all leaves out a runnable:\n%s", b.String())
	}
}
