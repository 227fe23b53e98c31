package roleserver

import (
	"bytes"
	"crypto/ed25519"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"plinth.dev/plinth/api/clusterpb"
	"plinth.dev/plinth/platform/pki"
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

// TestEraseEtcdData: a former member's etcd data and peer keys are
// overwritten with zeros and removed (a hard link taken before sees the
// zeros: the blocks were overwritten, not only unlinked), as are the
// directories an earlier erasure or an earlier version left aside; the
// directories are there again, empty, for a later membership.
func TestEraseEtcdData(t *testing.T) {
	root := &localstorage.Root{}
	if err := localstorage.Place(root, t.TempDir()); err != nil {
		t.Fatal(err)
	}
	secret := []byte(strings.Repeat("cluster CA key ", 100000))
	files := map[string][]byte{
		filepath.Join(root.Data.Etcd.Data.Path(), "member", "snap", "db"):     secret,
		filepath.Join(root.Data.Etcd.Data.Path(), "member", "wal", "0.wal"):   []byte("wal"),
		filepath.Join(root.Data.Etcd.PeerPKI.Path(), "key.pem"):               []byte("peer key"),
		filepath.Join(root.Data.Etcd.Data.Path()+".removed-1700000000", "db"): []byte("older member"),
	}
	var want int64
	for p, b := range files {
		if err := os.MkdirAll(filepath.Dir(p), 0o700); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(p, b, 0o600); err != nil {
			t.Fatal(err)
		}
		want += int64(len(b))
	}
	link := filepath.Join(t.TempDir(), "db-link")
	if err := os.Link(filepath.Join(root.Data.Etcd.Data.Path(), "member", "snap", "db"), link); err != nil {
		t.Fatal(err)
	}
	if !hasEtcdData(root) || !hasRetiredEtcdData(root) {
		t.Fatal("the test's etcd data is not seen")
	}
	n, err := eraseEtcdData(root)
	if err != nil || n != want {
		t.Fatalf("erased %d bytes, %v; want %d", n, err, want)
	}
	if hasEtcdData(root) || hasRetiredEtcdData(root) {
		t.Error("etcd data left after the erasure")
	}
	for _, d := range []string{root.Data.Etcd.Data.Path(), root.Data.Etcd.PeerPKI.Path()} {
		if e, err := os.ReadDir(d); err != nil || len(e) != 0 {
			t.Errorf("%s after the erasure: %v, %v; want it empty", d, e, err)
		}
	}
	if b, err := os.ReadFile(link); err != nil || len(b) != len(secret) || bytes.ContainsFunc(b, func(r rune) bool { return r != 0 }) {
		t.Errorf("the store's blocks were not overwritten with zeros (%v)", err)
	}
}
