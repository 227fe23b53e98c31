package roleserver

import (
	"crypto/ed25519"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"plinth.dev/plinth/api/clusterpb"
	"plinth.dev/plinth/platform/logtree"
	"plinth.dev/plinth/platform/pki"
	"plinth.dev/plinth/platform/supervisor"
	"plinth.dev/plinth/roleserver/identity"
	"plinth.dev/plinth/roleserver/localstorage"
)

func TestJoinCluster(t *testing.T) {
	ca, err := pki.NewCA("peer CA", 0)
	if err != nil {
		t.Fatal(err)
	}
	key := genKey(t)
	cert, err := identity.IssueNodeCertificate(ca, key.Public().(ed25519.PublicKey))
	if err != nil {
		t.Fatal(err)
	}
	crl, err := ca.NewCRL()
	if err != nil {
		t.Fatal(err)
	}
	self := identity.NodeID(key.Public().(ed25519.PublicKey))
	cm := &clusterpb.NodeRoles_ConsensusMember{
		CaCertificate:   ca.Certificate.Raw,
		NodeCertificate: cert.Raw,
		Peers: []*clusterpb.NodeRoles_ConsensusMember_Peer{
			{Name: "plinth-a", Url: "https://plinth-a:7834"},
			{Name: self, Url: "https://" + self + ":7834"},
		},
		InitialCrl: crl.Raw,
	}
	jc, err := joinCluster(cm, self)
	if err != nil {
		t.Fatal(err)
	}
	if !jc.CACertificate.Equal(ca.Certificate) || !jc.NodeCertificate.Equal(cert) || jc.InitialCRL == nil {
		t.Errorf("join cluster certificates/CRL not carried over: %+v", jc)
	}
	if len(jc.ExistingNodes) != 1 || jc.ExistingNodes[0].Name != "plinth-a" || jc.ExistingNodes[0].URL != "https://plinth-a:7834" {
		t.Errorf("existing nodes %+v, want only plinth-a (not self)", jc.ExistingNodes)
	}

	if jc, err := joinCluster(&clusterpb.NodeRoles_ConsensusMember{}, self); jc != nil || err != nil {
		t.Errorf("empty role: %v, %v; want nil, nil", jc, err)
	}
	other, _ := pki.NewCA("other", 0)
	otherCRL, _ := other.NewCRL()
	for name, bad := range map[string]func(*clusterpb.NodeRoles_ConsensusMember){
		"bad CA":          func(m *clusterpb.NodeRoles_ConsensusMember) { m.CaCertificate = []byte("x") },
		"bad cert":        func(m *clusterpb.NodeRoles_ConsensusMember) { m.NodeCertificate = nil },
		"CRL of other CA": func(m *clusterpb.NodeRoles_ConsensusMember) { m.InitialCrl = otherCRL.Raw },
		"only self":       func(m *clusterpb.NodeRoles_ConsensusMember) { m.Peers = m.Peers[1:] },
	} {
		m := &clusterpb.NodeRoles_ConsensusMember{CaCertificate: cm.CaCertificate, NodeCertificate: cm.NodeCertificate, Peers: cm.Peers, InitialCrl: cm.InitialCrl}
		bad(m)
		if _, err := joinCluster(m, self); err == nil {
			t.Errorf("%s: no error", name)
		}
	}
}

func TestHostsRenderParse(t *testing.T) {
	nodes := map[string]string{"plinth-b": "10.0.0.2", "plinth-a": "10.0.0.1", "plinth-self": "10.9.9.9", "bogus": "not-an-ip"}
	out := string(renderHosts(nodes, "plinth-self", "10.0.0.3"))
	want := hostsHeader + "127.0.0.1\tlocalhost\n::1\tlocalhost\n10.0.0.3\tplinth-self\n10.0.0.1\tplinth-a\n10.0.0.2\tplinth-b\n"
	if out != want {
		t.Fatalf("rendered:\n%s\nwant:\n%s", out, want)
	}
	back := parseHosts([]byte(out))
	if len(back) != 3 || back["plinth-a"] != "10.0.0.1" || back["plinth-self"] != "10.0.0.3" || back["localhost"] != "" {
		t.Errorf("parsed back %v", back)
	}
}

func TestLogHelpers(t *testing.T) {
	for l, want := range map[slog.Level]string{slog.LevelDebug: "DEBUG", slog.LevelInfo: "INFO", slog.LevelWarn: "WARNING", slog.LevelError: "ERROR"} {
		if got := levelName(l); got != want {
			t.Errorf("levelName(%v) = %s, want %s", l, got, want)
		}
	}
	exact := logMatcher("root.a", false)
	if !exact(logtree.Entry{DN: "root.a"}) || exact(logtree.Entry{DN: "root.a.b"}) {
		t.Error("non-recursive matcher")
	}
	if root := logMatcher("", false); !root(logtree.Entry{DN: "root"}) || root(logtree.Entry{DN: "root.x"}) {
		t.Error("empty DN, non-recursive: want the root only")
	}
	es := logEntries([]logtree.Entry{{Time: time.Unix(0, 42), Level: slog.LevelWarn, DN: "root.a", Message: "m", Attrs: []string{"k=v"}}})
	if e := es[0]; e.GetTimeUnixNanos() != 42 || e.GetLevel() != "WARNING" || e.GetDn() != "root.a" || e.GetMessage() != "m" || strings.Join(e.GetAttributes(), ",") != "k=v" {
		t.Errorf("converted entry %v", e)
	}
}

// TestMembershipRestart: a non-member that is given the consensus_member
// role without join data (and has no etcd data) must not start etcd (that
// would found a new cluster); removing the role again restarts the
// control plane as a non-member.
func TestMembershipRestart(t *testing.T) {
	n := newTestNode(t)
	n.start()
	ca, _ := pki.NewCA("cluster", 0)
	key := genKey(t)
	cert, _ := identity.IssueNodeCertificate(ca, key.Public().(ed25519.PublicKey))
	creds := &identity.Credentials{PrivateKey: key, Certificate: cert, CA: ca.Certificate}
	n.svc.ProvideRegisterData(creds, &clusterpb.ClusterDirectory{})

	waitLog := func(msg string) {
		t.Helper()
		eventually(t, 10*time.Second, "log "+msg, func() error {
			if logContains(n.lt, "roleserver.controlplane", msg) {
				return nil
			}
			return errString("not yet")
		})
	}
	waitLog("not a consensus member")
	n.svc.Roles.Set(&clusterpb.NodeRoles{ConsensusMember: &clusterpb.NodeRoles_ConsensusMember{}})
	waitLog("consensus_member role added")
	waitLog("carries no join data")
	if cp := get(&n.svc.ControlPlane); cp.Running {
		t.Error("control plane running without join data")
	}
	if hasEtcdData(n.svc.StorageRoot) {
		t.Error("etcd data created")
	}
	before := len(n.lt.Read("root.roleserver.controlplane", 0))
	n.svc.Roles.Set(&clusterpb.NodeRoles{KubernetesWorker: &clusterpb.NodeRoles_KubernetesWorker{}})
	eventually(t, 10*time.Second, "restart as non-member", func() error {
		es := n.lt.Read("root.roleserver.controlplane", 0)
		for _, e := range es[min(before, len(es)):] {
			if strings.Contains(e.Message, "not a consensus member") {
				return nil
			}
		}
		return errString("not yet")
	})
}

type errString string

func (e errString) Error() string { return string(e) }

func TestDamagedRolesFileNeverDemotesAMember(t *testing.T) {
	for _, tc := range []struct {
		name       string
		etcdData   bool
		wantMember bool
	}{
		{"etcd data on disk", true, true},
		{"no etcd data", false, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			root := &localstorage.Root{}
			if err := localstorage.Place(root, t.TempDir()); err != nil {
				t.Fatal(err)
			}
			if err := localstorage.Create(&root.Data, 0o700); err != nil {
				t.Fatal(err)
			}
			if err := root.Data.Node.Roles.Write([]byte("\xff\xff not a NodeRoles"), 0o600); err != nil {
				t.Fatal(err)
			}
			if tc.etcdData {
				if err := os.WriteFile(filepath.Join(root.Data.Etcd.Data.Path(), "member"), nil, 0o600); err != nil {
					t.Fatal(err)
				}
			}
			lt := logtree.New(100)
			s := New(Config{StorageRoot: root, LogTree: lt})
			s.loadRoles()
			if got := get(&s.Roles).GetConsensusMember() != nil; got != tc.wantMember {
				t.Fatalf("consensus member = %v, want %v", got, tc.wantMember)
			}
			found := false
			for _, e := range lt.Read("roleserver", 10) {
				found = found || strings.Contains(e.Message, "persisted roles unreadable")
			}
			if !found {
				t.Error("the damaged roles file was not reported")
			}
		})
	}
}

// TestCuratorEndpoints: the resolver's endpoints are the local curator,
// the cluster's consensus members, then the parameters' fallback, without
// duplicates — and never a decommissioned node's address, whichever list
// names it.
func TestCuratorEndpoints(t *testing.T) {
	e := curatorEndpoints{
		local:     "127.0.0.1:7835",
		directory: []string{"10.42.0.11:7835", "10.42.0.12:7835"},
		fallback:  []string{"10.42.0.10:7835", "10.42.0.11:7835", "10.42.0.13:7835"},
		former:    map[string]bool{"10.42.0.10": true, "10.42.0.12": true},
	}
	got := e.list()
	want := []string{"127.0.0.1:7835", "10.42.0.11:7835", "10.42.0.13:7835"}
	if strings.Join(got, ",") != strings.Join(want, ",") {
		t.Fatalf("endpoints %v, want %v", got, want)
	}
}

// TestCrashLoopsInStatus: a runnable that failed three times in a row
// (a Kubernetes component that keeps crashing) shows in the node status.
func TestCrashLoopsInStatus(t *testing.T) {
	s := New(Config{Runnables: func() []supervisor.Status {
		return []supervisor.Status{
			{DN: "root.roleserver.kubernetes.worker.kubelet", Failures: 3, LastErr: "exit status 1"},
			{DN: "root.roleserver.kubernetes.worker.proxy", Failures: 2, LastErr: "exit status 1"},
		}
	}})
	p := s.status().GetProblems()
	if len(p) != 1 || p[0].GetComponent() != "root.roleserver.kubernetes.worker.kubelet" || !strings.Contains(p[0].GetMessage(), "3 times in a row") {
		t.Fatalf("problems %v", p)
	}
}
