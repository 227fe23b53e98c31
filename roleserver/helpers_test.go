package roleserver

import (
	"context"
	"crypto/ed25519"
	"crypto/rand"
	"net"
	"os"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"plinth.dev/plinth/internal/testutil/poll"
	"plinth.dev/plinth/platform/logtree"
	"plinth.dev/plinth/platform/nodenames"
	"plinth.dev/plinth/platform/pki"
	"plinth.dev/plinth/platform/supervisor"
	"plinth.dev/plinth/roleserver/consensus"
	"plinth.dev/plinth/roleserver/identity"
	"plinth.dev/plinth/roleserver/internal/testutil"
	"plinth.dev/plinth/roleserver/localstorage"
)

// The package's test fixture: testNode (one Role Server on loopback with
// its own storage, log tree and supervisor), keys and credentials, and
// the polling and log helpers the tests of every worker share.

func genKey(t *testing.T) ed25519.PrivateKey {
	t.Helper()
	_, k, err := ed25519.GenerateKey(rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	return k
}

// testNode is one Role Server on loopback with its own storage tree, log
// tree and supervisor.
type testNode struct {
	t     *testing.T
	root  localstorage.Root
	names *nodenames.Table
	lt    *logtree.Tree
	old   []*logtree.Tree // of earlier runs, for the failure dump
	knobs knobs
	// config, if set, changes the Config before the Service is made.
	config func(*Config)

	svc    *Service
	sup    atomic.Pointer[supervisor.Supervisor]
	cancel context.CancelFunc
	power  chan bool
	// clusterKeyDropped is set once the node was asked to drop its
	// locally sealed cluster unlock key (answerClusterKey).
	clusterKeyDropped atomic.Bool
}

func newTestNode(t *testing.T) *testNode {
	t.Helper()
	// Short: the etcd client socket path is limited to ~107 bytes.
	dir, err := os.MkdirTemp("", "rs")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	n := &testNode{t: t, lt: logtree.New(50000), names: nodenames.NewTable(), power: make(chan bool, 4)}
	if err := localstorage.Place(&n.root, dir); err != nil {
		t.Fatal(err)
	}
	if err := localstorage.Create(&n.root.Data.Node, 0o700); err != nil {
		t.Fatal(err)
	}
	peerPort := testutil.FreePort(t)
	n.knobs = knobs{
		curatorPort:     testutil.FreePort(t),
		nodeMgmtPort:    testutil.FreePort(t),
		listenHost:      "127.0.0.1",
		addresses:       []string{"127.0.0.1"},
		consensusTuning: testutil.LoopbackTuning(peerPort),
		addNodeOptions: func(string) []*consensus.AddNodeOption {
			return []*consensus.AddNodeOption{testutil.LoopbackPeer(peerPort)}
		},
		curatorLeaderTTL: 2 * time.Second,
	}
	t.Cleanup(func() {
		n.stop()
		nlog, _ := strconv.Atoi(os.Getenv("ROLESERVER_TEST_LOGS"))
		if t.Failed() {
			nlog = max(nlog, 300)
		}
		if nlog > 0 {
			for i, lt := range append(n.old, n.lt) {
				t.Logf("--- logs of run %d", i+1)
				for _, e := range lt.Read("", nlog) {
					t.Log(e.String())
				}
			}
		}
	})
	return n
}

func (n *testNode) start() {
	n.t.Helper()
	k := n.knobs
	cfg := Config{
		StorageRoot: &n.root,
		LogTree:     n.lt,
		Version:     "v0.0.0-test",
		BootCount:   3,
		BootTime:    time.Unix(1700000000, 0),
		Names:       n.names,
		Power:       func(reboot bool) { n.power <- reboot },
		knobs:       &k,
	}
	if n.config != nil {
		n.config(&cfg)
	}
	n.svc = New(cfg)
	ctx, cancel := context.WithCancel(context.Background())
	n.cancel = cancel
	go n.answerClusterKey(ctx)
	n.sup.Store(supervisor.New(ctx, n.lt, func(ctx context.Context) error {
		if err := supervisor.Run(ctx, "roleserver", n.svc.Run); err != nil {
			return err
		}
		supervisor.Signal(ctx, supervisor.SignalHealthy)
		<-ctx.Done()
		return ctx.Err()
	}, supervisor.Options{InitialBackoff: 100 * time.Millisecond, MaxBackoff: time.Second}))
}

// answerClusterKey answers the Service's cluster unlock key requests, as
// enrolment does on a node (keeping nothing), and records a drop.
func (n *testNode) answerClusterKey(ctx context.Context) {
	w := n.svc.ClusterKey.Watch()
	defer w.Close()
	for {
		r, err := w.Get(ctx, NonNilClusterKey)
		if err != nil {
			return
		}
		if !r.Keep {
			n.clusterKeyDropped.Store(true)
		}
		r.Done(nil)
	}
}

func (n *testNode) stop() {
	if n.cancel == nil {
		return
	}
	n.cancel()
	n.sup.Load().Wait()
	n.cancel = nil
}

func (n *testNode) curatorAddr() string {
	return net.JoinHostPort("127.0.0.1", strconv.Itoa(n.knobs.curatorPort))
}

func (n *testNode) nodeMgmtAddr() string {
	return net.JoinHostPort("127.0.0.1", strconv.Itoa(n.knobs.nodeMgmtPort))
}

// eventually is poll.Until.
var eventually = poll.Until

func logContains(lt *logtree.Tree, dnSuffix, msg string) bool {
	for _, e := range lt.Read("", 0) {
		if strings.HasSuffix(e.DN, dnSuffix) && strings.Contains(e.Message, msg) {
			return true
		}
	}
	return false
}

// logEventually is logContains, polled until within.
func logEventually(lt *logtree.Tree, dnSuffix, msg string, within time.Duration) bool {
	deadline := time.Now().Add(within)
	for !logContains(lt, dnSuffix, msg) {
		if time.Now().After(deadline) {
			return false
		}
		time.Sleep(50 * time.Millisecond)
	}
	return true
}

type errString string

func (e errString) Error() string { return string(e) }

// issueCreds are credentials from ca for a new key: a curator's or a
// node's.
func issueCreds(t *testing.T, ca *pki.CA, curator bool) *identity.Credentials {
	t.Helper()
	key := genKey(t)
	pub := key.Public().(ed25519.PublicKey)
	issue := identity.IssueNodeCertificate
	if curator {
		issue = identity.IssueCuratorCertificate
	}
	cert, err := issue(ca, pub)
	if err != nil {
		t.Fatal(err)
	}
	c, err := identity.NewCredentials(key, cert.Raw, ca.Certificate.Raw)
	if err != nil {
		t.Fatal(err)
	}
	return c
}
