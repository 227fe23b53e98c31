package consensus

import (
	"context"
	"crypto/ed25519"
	"crypto/rand"
	"crypto/x509"
	"encoding/hex"
	"fmt"
	"net"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"sync"

	"go.etcd.io/etcd/client/pkg/v3/transport"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.etcd.io/etcd/server/v3/embed"
	"go.uber.org/zap"
	"golang.org/x/sys/unix"

	"plinth.dev/plinth/platform/pki"
	"plinth.dev/plinth/platform/supervisor"
)

// Keys of the consensus service itself, in etcd's raw keyspace. No
// namespaced client can reach them: the CA key lives here.
const (
	keyCACert = "/consensus/pki/ca.pem"
	keyCAKey  = "/consensus/pki/ca-key.pem"
	keyCRL    = "/consensus/pki/crl.der"
	// keyMembers + node ID + "/cert" is the member certificate issued by
	// AddNode (kept to answer a repeated AddNode with the same certificate
	// and to know which serial to revoke), + "/peer" its peer URL.
	keyMembers = "/consensus/members/"

	curatorPrefix    = "/curator/"
	kubernetesPrefix = "/kubernetes/"
)

func memberCertKey(nodeID string) string { return keyMembers + nodeID + "/cert" }
func memberPeerKey(nodeID string) string { return keyMembers + nodeID + "/peer" }

// peerServerName is the DNS name in every member certificate, and the name
// every member expects in its peers' certificates. Peers are dialled by
// address (an IP, or a node ID resolved by the cluster), so the address
// cannot be what identifies a member: the cluster CA and the CRL are.
const peerServerName = "consensus.plinth.internal"

// issueMemberCertificate gives a member one certificate for both ends of a
// peer connection: etcd uses the same file to serve and to dial.
func issueMemberCertificate(ca *pki.CA, nodeID string, pub ed25519.PublicKey) (*x509.Certificate, error) {
	return ca.Issue(pki.Template{
		CommonName: nodeID,
		DNSNames:   []string{peerServerName},
		PublicKey:  pub,
		Usage:      pki.UsageServerAndClient,
	})
}

// baseConfig is what the temporary bootstrap instance and the real member
// have in common.
func (s *Service) baseConfig(lg *zap.Logger, k Tuning, dataDir string) (*embed.Config, error) {
	cfg := embed.NewConfig()
	cfg.Name = s.config.NodeID
	cfg.Dir = dataDir
	cfg.Logger = "zap"
	cfg.ZapLoggerBuilder = embed.NewZapLoggerBuilder(lg.Named("etcd"))

	// etcd's keyspace holds the cluster CA key: no client may reach it
	// over the network, nor through a socket. Every client is in-process
	// (backend); embed wants a client listener all the same, so it gets a
	// unix socket on the node's tmpfs, which startEtcd unlinks at once.
	sock, err := url.Parse("unix://" + s.config.Ephemeral.ClientSocket.Path())
	if err != nil {
		return nil, fmt.Errorf("consensus: client socket URL: %w", err)
	}
	cfg.ListenClientUrls = []url.URL{*sock}
	cfg.AdvertiseClientUrls = []url.URL{*sock}
	cfg.ListenClientHttpUrls = nil
	cfg.ListenMetricsUrls = nil
	// The gateway would dial that socket itself, and serves nothing
	// anybody needs.
	cfg.EnableGRPCGateway = false

	cfg.TickMs = k.TickMs
	cfg.ElectionMs = k.ElectionMs
	cfg.UnsafeNoFsync = k.NoFsync
	// No auto-compaction: the compactor runnable compacts, and tells the
	// API server so (compactor.go).
	return cfg, nil
}

// etcdConfig is the configuration of the real member: peers over mTLS.
// join is nil unless this is the member's first start in an existing
// cluster.
func (s *Service) etcdConfig(lg *zap.Logger, k Tuning, d disk, join *JoinCluster) (*embed.Config, error) {
	cfg, err := s.baseConfig(lg, k, d.dataDir())
	if err != nil {
		return nil, err
	}
	listen, err := url.Parse("https://" + k.PeerListen)
	if err != nil {
		return nil, fmt.Errorf("consensus: peer listen address %q: %w", k.PeerListen, err)
	}
	advertise, err := url.Parse("https://" + k.PeerAdvertise)
	if err != nil {
		return nil, fmt.Errorf("consensus: peer advertise address %q: %w", k.PeerAdvertise, err)
	}
	cfg.ListenPeerUrls = []url.URL{*listen}
	cfg.AdvertisePeerUrls = []url.URL{*advertise}
	cfg.PeerTLSInfo = transport.TLSInfo{
		CertFile:       d.certPath(),
		KeyFile:        d.keyPath(),
		TrustedCAFile:  d.caPath(),
		ClientCertAuth: true,
		CRLFile:        d.crlPath(),
		// Members connect from whatever source address their route picks;
		// tying certificates to addresses would break on every renumbering.
		SkipClientSANVerify: true,
		ServerName:          peerServerName,
	}

	// With a WAL on disk etcd ignores the initial cluster, but still
	// validates that this member is in it.
	initial := []string{s.config.NodeID + "=" + advertise.String()}
	cfg.ClusterState = embed.ClusterStateFlagNew
	if join != nil {
		cfg.ClusterState = embed.ClusterStateFlagExisting
		used := map[string]bool{s.config.NodeID: true}
		for i, n := range join.ExistingNodes {
			name := n.Name
			if name == s.config.NodeID {
				continue
			}
			// etcd keys the initial cluster by name; members that have
			// not started yet have no name, and only URLs are compared.
			if name == "" || used[name] {
				name = fmt.Sprintf("member-%d", i)
			}
			used[name] = true
			initial = append(initial, name+"="+n.URL)
		}
	}
	cfg.InitialCluster = strings.Join(initial, ",")
	return cfg, nil
}

// bootstrap creates a one-member cluster and its PKI. The CA key must only
// ever exist inside etcd, and etcd cannot serve peer TLS before the CA
// exists, so the cluster is first brought up loopback-only and without
// peer TLS, the PKI is created inside it, and its peer URL is switched to
// the real one; Run then starts it again, with mTLS.
//
// Everything is built in bootstrapDir and moved into place at the end: a
// crash half-way leaves that directory behind, which lets the next attempt
// tell an unfinished bootstrap (start over) from a member that lost its
// data (refuse).
func (s *Service) bootstrap(ctx context.Context, k Tuning, d disk) error {
	log := supervisor.Logger(ctx)
	log.Info("no etcd data and no JoinCluster: bootstrapping a new cluster")
	tmp := d.bootstrapDir()
	if err := os.RemoveAll(tmp); err != nil {
		return err
	}
	tmpData := filepath.Join(tmp, "data")
	if err := os.MkdirAll(tmpData, 0o700); err != nil {
		return err
	}
	// The temporary member's shutdown is part of a bootstrap, not a
	// fault: its listener complaints are demoted like at node shutdown.
	tmpStopping := make(chan struct{})
	cfg, err := s.baseConfig(newZapLogger(log, ctx.Done(), tmpStopping), k, tmpData)
	if err != nil {
		return err
	}
	port, err := freeLoopbackPort()
	if err != nil {
		return err
	}
	loop, _ := url.Parse(fmt.Sprintf("http://127.0.0.1:%d", port))
	cfg.ListenPeerUrls = []url.URL{*loop}
	cfg.AdvertisePeerUrls = []url.URL{*loop}
	cfg.InitialCluster = s.config.NodeID + "=" + loop.String()
	cfg.ClusterState = embed.ClusterStateFlagNew
	token := make([]byte, 16)
	if _, err := rand.Read(token); err != nil {
		return err
	}
	// The token makes the cluster ID unique even between clusters whose
	// first members share a node ID and peer URL.
	cfg.InitialClusterToken = "plinth-" + hex.EncodeToString(token)

	e, err := startEtcd(cfg)
	if err != nil {
		return fmt.Errorf("starting temporary etcd: %w", err)
	}
	// etcd must be gone before its directory moves, and a second Close of
	// embed.Etcd is not safe.
	stopEtcd := sync.OnceFunc(func() { close(tmpStopping); closeEtcd(e) })
	defer stopEtcd()
	if err := waitReady(ctx, e, k.ReadyTimeout); err != nil {
		return err
	}
	cl := newServerBackend(e.Server)
	closeClient := sync.OnceFunc(func() { cl.close() })
	defer closeClient()

	ca, err := pki.NewCA("Plinth consensus CA", 0)
	if err != nil {
		return err
	}
	cert, err := issueMemberCertificate(ca, s.config.NodeID, s.config.NodePrivateKey.Public().(ed25519.PublicKey))
	if err != nil {
		return err
	}
	crl, err := ca.NewCRL()
	if err != nil {
		return err
	}
	caCertPEM, caKeyPEM, err := ca.MarshalPEM()
	if err != nil {
		return err
	}
	advertise := "https://" + k.PeerAdvertise
	if _, err := cl.Txn(ctx).Then(
		clientv3.OpPut(keyCACert, string(caCertPEM)),
		clientv3.OpPut(keyCAKey, string(caKeyPEM)),
		clientv3.OpPut(keyCRL, string(crl.Raw)),
		clientv3.OpPut(memberCertKey(s.config.NodeID), string(pki.CertificatePEM(cert))),
		clientv3.OpPut(memberPeerKey(s.config.NodeID), advertise),
	).Commit(); err != nil {
		return fmt.Errorf("storing PKI: %w", err)
	}
	if _, err := cl.MemberUpdate(ctx, uint64(e.Server.MemberID()), []string{advertise}); err != nil {
		return fmt.Errorf("setting peer URL: %w", err)
	}
	closeClient()
	stopEtcd()

	if err := d.writePKI(ca.Certificate, cert, s.config.NodePrivateKey, crl); err != nil {
		return err
	}
	// rename(2) replaces the empty data directory localstorage created;
	// os.Rename refuses to. A non-empty one makes this fail, as it should.
	if err := unix.Rename(tmpData, d.dataDir()); err != nil {
		return fmt.Errorf("moving new cluster into %s: %w", d.dataDir(), err)
	}
	if err := syncDir(filepath.Dir(d.dataDir())); err != nil {
		return err
	}
	if err := os.RemoveAll(tmp); err != nil {
		return err
	}
	log.Info("new cluster bootstrapped", "peer-url", advertise)
	return nil
}

func freeLoopbackPort() (int, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, err
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port, nil
}
