package main

import (
	"bytes"
	"encoding/base64"
	"errors"
	"flag"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"plinth.dev/plinth/api/clusterpb"
	"plinth.dev/plinth/api/nodepb"
	"plinth.dev/plinth/platform/pki"
)

// params -register without -ca/-ticket/-curator takes them from the
// cluster, with the configuration dir given.
func TestParamsRegisterFromCluster(t *testing.T) {
	ca, err := pki.NewCA("cluster", 0)
	if err != nil {
		t.Fatal(err)
	}
	var asked string
	old := fetchRegister
	t.Cleanup(func() { fetchRegister = old })
	fetchRegister = func(dir string) (*nodepb.Register, error) {
		asked = dir
		return &nodepb.Register{ClusterCaCertificate: ca.Certificate.Raw, RegisterTicket: []byte{0, 1, 2}, CuratorEndpoints: []string{"10.42.0.10:7835"}}, nil
	}
	out := filepath.Join(t.TempDir(), "reg.pb")
	p, _ := params(t, "-o", out, "-register", "-config", "/some/config")
	r := p.GetRegister()
	if asked != "/some/config" || !bytes.Equal(r.GetClusterCaCertificate(), ca.Certificate.Raw) ||
		!bytes.Equal(r.GetRegisterTicket(), []byte{0, 1, 2}) || !slices.Equal(r.GetCuratorEndpoints(), []string{"10.42.0.10:7835"}) {
		t.Errorf("asked %q, wrote %v", asked, r)
	}

	// Any of the explicit flags means: do not ask the cluster.
	fetchRegister = func(string) (*nodepb.Register, error) { return nil, errors.New("must not be called") }
	b64 := base64.StdEncoding.EncodeToString([]byte{0xff, 0, 7})
	caFile := filepath.Join(t.TempDir(), "ca.pem")
	if err := writeTestFile(caFile, pki.CertificatePEM(ca.Certificate)); err != nil {
		t.Fatal(err)
	}
	p, _ = params(t, "-o", out, "-register", "-ca", caFile, "-ticket-base64", b64, "-curator", "10.0.0.1:7835")
	if got := p.GetRegister().GetRegisterTicket(); !bytes.Equal(got, []byte{0xff, 0, 7}) {
		t.Errorf("ticket %x from -ticket-base64", got)
	}
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"-o", out, "-register"}, "must not be called"},
		{[]string{"-o", out, "-register", "-ticket", "a", "-ticket-base64", "YQ=="}, "not both"},
		{[]string{"-o", out, "-bootstrap", "-config", "x"}, "-config only applies with -register"},
	} {
		err := runParams(tc.args, &bytes.Buffer{}, &bytes.Buffer{})
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%v: %v, want %q", tc.args, err, tc.want)
		}
	}
}

func writeTestFile(path string, b []byte) error { return paramsWriteFile(path, b, 0o644) }

func TestParseArgsInterspersed(t *testing.T) {
	fs := flag.NewFlagSet("x", flag.ContinueOnError)
	o := fs.String("o", "", "")
	f := fs.Bool("f", false, "")
	pos, err := parseArgs(fs, []string{"describe", "-o", "json", "node-a", "-f", "--", "-literal"})
	if err != nil || *o != "json" || !*f || !slices.Equal(pos, []string{"describe", "node-a", "-literal"}) {
		t.Errorf("pos %q, -o %q, -f %v, err %v", pos, *o, *f, err)
	}
}

func TestNodeTable(t *testing.T) {
	now := time.Unix(1000, 0)
	nodes := []*clusterpb.Node{
		{
			Id: "plinth-aaaa", State: clusterpb.NodeState_NODE_STATE_UP, Health: clusterpb.NodeHealth_NODE_HEALTH_HEALTHY,
			Status:                 &clusterpb.NodeStatus{Addresses: []string{"10.42.0.10", "10.42.0.99"}},
			Roles:                  &clusterpb.NodeRoles{ConsensusMember: &clusterpb.NodeRoles_ConsensusMember{}, KubernetesWorker: &clusterpb.NodeRoles_KubernetesWorker{}},
			LastHeartbeatUnixNanos: now.Add(-3 * time.Second).UnixNano(),
			ConsensusMembership:    clusterpb.ConsensusMembership_CONSENSUS_MEMBERSHIP_VOTER,
		},
		{Id: "plinth-bbbb", State: clusterpb.NodeState_NODE_STATE_NEW},
		{Id: "plinth-cccc", State: clusterpb.NodeState_NODE_STATE_UP, ConsensusMemberPending: true,
			ConsensusMembership: clusterpb.ConsensusMembership_CONSENSUS_MEMBERSHIP_NONE},
	}
	var b bytes.Buffer
	if err := printNodeTable(&b, nodes, now); err != nil {
		t.Fatal(err)
	}
	want := `ID           STATE  HEALTH   ADDRESS     ROLES                               ETCD     LAST SEEN
plinth-aaaa  UP     HEALTHY  10.42.0.10  consensus-member,kubernetes-worker  voter    3s ago
plinth-bbbb  NEW    -        -           -                                   -        never
plinth-cccc  UP     -        -           -                                   pending  never
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

func TestFormatLogEntry(t *testing.T) {
	e := &clusterpb.LogEntry{TimeUnixNanos: time.Date(2025, 1, 2, 3, 4, 5, 6000, time.Local).UnixNano(), Level: "INFO",
		Dn: "root.network", Message: "configured address", Attributes: []string{"address=10.42.0.10/24"}}
	if got, want := formatLogEntry(e), "2025-01-02 03:04:05.000006 I root.network: configured address address=10.42.0.10/24"; got != want {
		t.Errorf("got  %q\nwant %q", got, want)
	}
}
