package consensus

import (
	"bufio"
	"context"
	"crypto/ed25519"
	"crypto/rand"
	"crypto/sha256"
	"crypto/tls"
	"crypto/x509"
	"encoding/hex"
	"fmt"
	"io"
	"io/fs"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"plinth.dev/plinth/internal/testutil/poll"
	"plinth.dev/plinth/platform/logtree"
	"plinth.dev/plinth/platform/supervisor"
	"plinth.dev/plinth/roleserver/localstorage"
)

// member is one consensus member of a test cluster, on loopback, in its
// own temporary directory tree and under its own supervisor.
type member struct {
	tb   testing.TB
	name string
	root localstorage.Root
	priv ed25519.PrivateKey
	port int
	lt   *logtree.Tree

	svc    *Service
	sup    *supervisor.Supervisor
	cancel context.CancelFunc
}

func newMember(tb testing.TB, name string) *member {
	tb.Helper()
	m := &member{tb: tb, name: name, lt: logtree.New(20000)}
	if err := localstorage.Place(&m.root, tb.TempDir()); err != nil {
		tb.Fatal(err)
	}
	if err := localstorage.Create(&m.root.Data.Etcd, 0o700); err != nil {
		tb.Fatal(err)
	}
	if err := localstorage.Create(&m.root.Ephemeral.Consensus, 0o700); err != nil {
		tb.Fatal(err)
	}
	_, m.priv, _ = ed25519.GenerateKey(rand.Reader)
	m.port = uniquePort(tb)
	tb.Cleanup(func() {
		m.stop()
		// CONSENSUS_TEST_LOGS=N dumps the last N entries of every member.
		n, _ := strconv.Atoi(os.Getenv("CONSENSUS_TEST_LOGS"))
		if t, ok := tb.(*testing.T); ok && t.Failed() {
			n = max(n, 150)
		}
		if n > 0 {
			for _, e := range m.lt.Read("", n) {
				tb.Logf("[%s] %s", m.name, e)
			}
		}
	})
	return m
}

func (m *member) pub() ed25519.PublicKey { return m.priv.Public().(ed25519.PublicKey) }

func (m *member) peerAddr() string { return net.JoinHostPort("127.0.0.1", strconv.Itoa(m.port)) }

func (m *member) config(join *JoinCluster) Config {
	return Config{
		Data:           &m.root.Data.Etcd,
		Ephemeral:      &m.root.Ephemeral.Consensus,
		JoinCluster:    join,
		NodeID:         m.name,
		NodePrivateKey: m.priv,
		Tuning: Tuning{
			PeerListen:    m.peerAddr(),
			PeerAdvertise: m.peerAddr(),
			// Short raft timings: loopback, but two shared cores and the
			// race detector.
			TickMs:          50,
			ElectionMs:      500,
			ReadyTimeout:    20 * time.Second,
			PromoteInterval: 100 * time.Millisecond,
			NoFsync:         true,
		},
	}
}

// start runs the member under a real supervisor.
func (m *member) start(join *JoinCluster) {
	m.startConfig(m.config(join))
}

func (m *member) startConfig(cfg Config) {
	m.tb.Helper()
	if m.sup != nil {
		m.tb.Fatalf("%s already started", m.name)
	}
	m.svc = New(cfg)
	ctx, cancel := context.WithCancel(context.Background())
	m.cancel = cancel
	m.sup = supervisor.New(ctx, m.lt, m.svc.Run, supervisor.Options{InitialBackoff: 200 * time.Millisecond, MaxBackoff: time.Second})
}

func (m *member) stop() {
	if m.sup == nil {
		return
	}
	m.cancel()
	m.sup.Wait()
	m.sup, m.svc = nil, nil
}

// running waits for a running status.
func (m *member) running(timeout time.Duration) *Status {
	m.tb.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	w := m.svc.Watch()
	defer w.Close()
	st, err := w.Get(ctx, FilterRunning)
	if err != nil {
		m.tb.Fatalf("%s not running after %v: %v (supervisor: %+v)", m.name, timeout, err, m.sup.Snapshot())
	}
	return st
}

// failure waits until the member's runnable failed at least once and
// returns its last error.
func (m *member) failure(timeout time.Duration) string {
	m.tb.Helper()
	deadline := time.Now().Add(timeout)
	for time.Now().Before(deadline) {
		for _, st := range m.sup.Snapshot() {
			if st.DN == "root" && st.Restarts > 0 && st.LastErr != "" {
				return st.LastErr
			}
		}
		time.Sleep(50 * time.Millisecond)
	}
	m.tb.Fatalf("%s did not fail within %v: %+v", m.name, timeout, m.sup.Snapshot())
	return ""
}

// addOption points AddNode at the member's loopback peer port.
func (m *member) addOption() *AddNodeOption {
	return PeerAddress("127.0.0.1", m.port)
}

func (m *member) disk() disk { return newDisk(&m.root.Data.Etcd) }

// logged reports whether an entry containing s was logged.
func (m *member) logged(s string) bool {
	for _, e := range m.lt.Read("", 20000) {
		if strings.Contains(e.String(), s) {
			return true
		}
	}
	return false
}

func ctxTimeout(tb testing.TB, d time.Duration) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), d)
	tb.Cleanup(cancel)
	return ctx
}

// eventually is poll.Until.
var eventually = poll.Until

// hashTree hashes every path, mode and file content below dir.
func hashTree(tb testing.TB, dir string) string {
	tb.Helper()
	h := sha256.New()
	err := filepath.WalkDir(dir, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		info, err := d.Info()
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(dir, p)
		fmt.Fprintf(h, "%s %v %d\n", rel, info.Mode(), info.Size())
		if d.Type().IsRegular() {
			f, err := os.Open(p)
			if err != nil {
				return err
			}
			defer f.Close()
			if _, err := io.Copy(h, f); err != nil {
				return err
			}
		}
		return nil
	})
	if err != nil {
		tb.Fatal(err)
	}
	return hex.EncodeToString(h.Sum(nil))
}

// peerAccepts opens a peer connection to addr presenting cert and makes one
// request: etcd checks the CRL after the TLS handshake (and TLS 1.3 reports
// a refused client certificate only on the first read), so only a response
// proves acceptance.
func peerAccepts(addr string, cert tls.Certificate, ca *x509.Certificate) error {
	roots := x509.NewCertPool()
	roots.AddCert(ca)
	conn, err := tls.DialWithDialer(&net.Dialer{Timeout: 3 * time.Second}, "tcp", addr, &tls.Config{
		Certificates: []tls.Certificate{cert},
		RootCAs:      roots,
		ServerName:   peerServerName,
	})
	if err != nil {
		return err
	}
	defer conn.Close()
	conn.SetDeadline(time.Now().Add(3 * time.Second))
	if _, err := io.WriteString(conn, "GET /version HTTP/1.1\r\nHost: peer\r\nConnection: close\r\n\r\n"); err != nil {
		return err
	}
	resp, err := http.ReadResponse(bufio.NewReader(conn), nil)
	if err != nil {
		return err
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("status %s", resp.Status)
	}
	return nil
}

func tlsCert(cert *x509.Certificate, key ed25519.PrivateKey) tls.Certificate {
	return tls.Certificate{Certificate: [][]byte{cert.Raw}, PrivateKey: key, Leaf: cert}
}

// uniquePort is a free loopback port this test process has not handed
// out before: members are given theirs before they start, and the
// kernel may give a port it handed out, still unbound, again (two
// members with one peer URL: "Peer URLs already exists").
func uniquePort(tb testing.TB) int {
	tb.Helper()
	portsMu.Lock()
	defer portsMu.Unlock()
	for range 100 {
		port, err := freeLoopbackPort()
		if err != nil {
			tb.Fatal(err)
		}
		if !portsGiven[port] {
			portsGiven[port] = true
			return port
		}
	}
	tb.Fatal("no free loopback port not handed out before")
	return 0
}

var (
	portsMu    sync.Mutex
	portsGiven = map[int]bool{}
)
