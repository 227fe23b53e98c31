package curator

import (
	"context"
	"crypto/ed25519"
	"crypto/rand"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"plinth.dev/plinth/api/clusterpb"
)

func TestHealth(t *testing.T) {
	s := New(Config{HeartbeatTimeout: 2 * time.Second})
	now := time.Now()
	ago := func(d time.Duration) time.Time { return now.Add(-d) }
	up := clusterpb.NodeState_NODE_STATE_UP
	for _, tc := range []struct {
		name     string
		state    clusterpb.NodeState
		stored   time.Time // zero: none
		since    time.Time // zero: no leader known
		want     clusterpb.NodeHealth
		wantLast bool
	}{
		{"young leader, no heartbeat", up, time.Time{}, ago(time.Second), clusterpb.NodeHealth_NODE_HEALTH_UNKNOWN, false},
		{"old leader, no heartbeat", up, time.Time{}, ago(10 * time.Second), clusterpb.NodeHealth_NODE_HEALTH_HEARTBEAT_TIMEOUT, false},
		{"recent heartbeat", up, ago(time.Second), ago(10 * time.Second), clusterpb.NodeHealth_NODE_HEALTH_HEALTHY, true},
		{"stale heartbeat", up, ago(5 * time.Second), ago(10 * time.Second), clusterpb.NodeHealth_NODE_HEALTH_HEARTBEAT_TIMEOUT, true},
		{"heartbeat from the previous leader, young leader", up, ago(1500 * time.Millisecond), ago(time.Second), clusterpb.NodeHealth_NODE_HEALTH_UNKNOWN, false},
		{"heartbeat from the previous leader, old leader", up, ago(11 * time.Second), ago(10 * time.Second), clusterpb.NodeHealth_NODE_HEALTH_HEARTBEAT_TIMEOUT, false},
		{"no leader", up, ago(time.Second), time.Time{}, clusterpb.NodeHealth_NODE_HEALTH_UNKNOWN, false},
		{"not a member yet", clusterpb.NodeState_NODE_STATE_NEW, ago(time.Second), ago(10 * time.Second), clusterpb.NodeHealth_NODE_HEALTH_UNSPECIFIED, false},
	} {
		n := &clusterpb.Node{Id: "n", State: tc.state}
		var stored int64
		if !tc.stored.IsZero() {
			stored = tc.stored.UnixNano()
		}
		s.health(n, stored, tc.since, now)
		if n.Health != tc.want || (n.LastHeartbeatUnixNanos != 0) != tc.wantLast || (tc.wantLast && n.LastHeartbeatUnixNanos != stored) {
			t.Errorf("%s: health %v, last %d; want %v, last set %v", tc.name, n.Health, n.LastHeartbeatUnixNanos, tc.want, tc.wantLast)
		}
	}

	// The leader's own heartbeats (written or not) count, and it reads
	// none from etcd (kv is nil: a read would panic).
	s.term = &term{ctx: context.Background(), since: ago(10 * time.Second)}
	s.hb["n"] = &heartbeatState{seen: ago(100 * time.Millisecond)}
	n := &clusterpb.Node{Id: "n", State: up}
	stale := &clusterpb.Node{Id: "m", State: up}
	if err := s.withHealth(context.Background(), nil, n, stale); err != nil {
		t.Fatal(err)
	}
	if n.Health != clusterpb.NodeHealth_NODE_HEALTH_HEALTHY || n.LastHeartbeatUnixNanos != s.hb["n"].seen.UnixNano() {
		t.Errorf("leader's in-memory heartbeat ignored: %v %d", n.Health, n.LastHeartbeatUnixNanos)
	}
	if stale.Health != clusterpb.NodeHealth_NODE_HEALTH_HEARTBEAT_TIMEOUT {
		t.Errorf("a node that sent the leader nothing this term is %v, want a heartbeat timeout", stale.Health)
	}
	if got := s.heartbeatWriteInterval(); got > HeartbeatInterval || got <= 0 {
		t.Errorf("heartbeat write interval %v", got)
	}
	if got := New(Config{}).heartbeatWriteInterval(); got != HeartbeatInterval {
		t.Errorf("production heartbeat write interval %v, want %v", got, HeartbeatInterval)
	}
}

func TestFilter(t *testing.T) {
	nodes := []*clusterpb.Node{
		{Id: "a", State: clusterpb.NodeState_NODE_STATE_UP, Roles: &clusterpb.NodeRoles{ConsensusMember: &clusterpb.NodeRoles_ConsensusMember{}}, Health: clusterpb.NodeHealth_NODE_HEALTH_HEALTHY},
		{Id: "b", State: clusterpb.NodeState_NODE_STATE_NEW, TpmUsage: clusterpb.NodeTPMUsage_NODE_TPM_USAGE_NOT_PRESENT},
		{Id: "c", State: clusterpb.NodeState_NODE_STATE_UP, Roles: &clusterpb.NodeRoles{KubernetesWorker: &clusterpb.NodeRoles_KubernetesWorker{}}},
	}
	for expr, want := range map[string]string{
		"":                            "abc",
		"node.state == NODE_STATE_UP": "ac",
		"node.state != NODE_STATE_UP": "b",
		"node.state == plinth.cluster.v1.NodeState.NODE_STATE_NEW": "b",
		`node.id == "c"`:                   "c",
		"has(node.roles.consensus_member)": "a",
		"!has(node.roles.consensus_member) && node.state == NODE_STATE_UP": "c",
		"node.health == NODE_HEALTH_HEALTHY":                               "a",
		"node.tpm_usage == NODE_TPM_USAGE_NOT_PRESENT":                     "b",
	} {
		f, err := parseFilter(expr)
		if err != nil {
			t.Errorf("%q: %v", expr, err)
			continue
		}
		got := ""
		for _, n := range nodes {
			if f(n) {
				got += n.Id
			}
		}
		if got != want {
			t.Errorf("%q matched %q, want %q", expr, got, want)
		}
	}
	for _, bad := range []string{"node.state == NODE_STATE_BOGUS", "node.id == c", "node.roles.size() > 0", "has(node.foo)", "node.state > 1 || true"} {
		if _, err := parseFilter(bad); err == nil {
			t.Errorf("%q accepted", bad)
		}
	}
}

// TestRegisterStoragePolicy: a node whose data partition is protected
// less than the cluster's minimum_storage_security is refused at
// registration, a node that does not say counts as encrypted (as every
// data partition is), and no minimum refuses nothing.
func TestRegisterStoragePolicy(t *testing.T) {
	const (
		unspecified   = clusterpb.StorageSecurity_STORAGE_SECURITY_UNSPECIFIED
		encrypted     = clusterpb.StorageSecurity_STORAGE_SECURITY_ENCRYPTED
		authenticated = clusterpb.StorageSecurity_STORAGE_SECURITY_AUTHENTICATED
	)
	for _, c := range []struct {
		minimum, node clusterpb.StorageSecurity
		ok            bool
	}{
		{unspecified, unspecified, true}, {unspecified, encrypted, true}, {unspecified, authenticated, true},
		{encrypted, unspecified, true}, {encrypted, encrypted, true}, {encrypted, authenticated, true},
		{authenticated, unspecified, false}, {authenticated, encrypted, false}, {authenticated, authenticated, true},
	} {
		err := checkStoragePolicy(&clusterpb.ClusterConfiguration{MinimumStorageSecurity: c.minimum}, c.node)
		if (err == nil) != c.ok {
			t.Errorf("minimum %v, node %v: %v", c.minimum, c.node, err)
		}
		if err != nil && status.Code(err) != codes.FailedPrecondition {
			t.Errorf("minimum %v, node %v: code %v, want FailedPrecondition", c.minimum, c.node, status.Code(err))
		}
	}
}

func TestTPMPolicy(t *testing.T) {
	strict, lax := &clusterpb.ClusterConfiguration{}, &clusterpb.ClusterConfiguration{AllowNodesWithoutTpm: true}
	for _, u := range []clusterpb.NodeTPMUsage{clusterpb.NodeTPMUsage_NODE_TPM_USAGE_UNSPECIFIED, clusterpb.NodeTPMUsage_NODE_TPM_USAGE_NOT_PRESENT, clusterpb.NodeTPMUsage_NODE_TPM_USAGE_NOT_USED_BY_POLICY} {
		if checkTPMPolicy(strict, u) == nil {
			t.Errorf("%v accepted by a policy requiring a TPM", u)
		}
		if err := checkTPMPolicy(lax, u); err != nil {
			t.Errorf("%v refused by a policy allowing nodes without TPM: %v", u, err)
		}
	}
	if err := checkTPMPolicy(strict, clusterpb.NodeTPMUsage_NODE_TPM_USAGE_USED); err != nil {
		t.Errorf("TPM node refused: %v", err)
	}
	// The first node is held to the same policy (refused before etcd is
	// touched, hence the nil client).
	key := func() ed25519.PublicKey { p, _, _ := ed25519.GenerateKey(rand.Reader); return p }
	_, _, err := Bootstrap(context.Background(), nil, BootstrapRequest{
		NodePublicKey: key(), JoinPublicKey: key(), OwnerPublicKey: key(),
		TPMUsage: clusterpb.NodeTPMUsage_NODE_TPM_USAGE_NOT_PRESENT,
	})
	if err == nil || !strings.Contains(err.Error(), "TPM") {
		t.Errorf("Bootstrap of a node without TPM under a TPM policy: %v", err)
	}
}
