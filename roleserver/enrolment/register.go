package enrolment

import (
	"context"
	"crypto/ed25519"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"net"
	"os"
	"strconv"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/connectivity"
	"google.golang.org/grpc/status"

	"plinth.dev/plinth/api/clusterpb"
	"plinth.dev/plinth/platform/layout"
	"plinth.dev/plinth/platform/storage"
	"plinth.dev/plinth/platform/supervisor"
	"plinth.dev/plinth/roleserver/identity"
	"plinth.dev/plinth/roleserver/rpc"
)

// Retry pacing: a refusal needs a person to act, so it is retried
// slowly; an unreachable or busy cluster is retried briskly.
const (
	retryUnavailable = 2 * time.Second
	retryRefused     = 30 * time.Second
	approvalPoll     = 2 * time.Second
	approvalReminder = 30 * time.Second
)

func (s *Service) registerOrJoin(ctx context.Context, l *slog.Logger) error {
	h, err := storage.Peek(s.Disk.Disk)
	if err != nil {
		return fmt.Errorf("reading the data disk header: %w", err)
	}
	l.Info("waiting for the network")
	st, err := s.Network.WaitAddress(ctx)
	if err != nil {
		return err
	}
	l.Info("network up", "address", st.Address.String())
	if h != nil && len(h.Enrolment) > 0 {
		js, err := unsealJoinState(s.Keys, h.Enrolment)
		if err != nil {
			return fmt.Errorf("%w: %v", storage.ErrRefused, err)
		}
		if js.pending() {
			// Registered (or about to) before a reboot, not committed
			// yet: carry on with the same keys, so the owner approves
			// the node it saw and no second NEW record appears.
			return s.register(ctx, l, js)
		}
		// Set up (or its setup began) after a commit: this node is a
		// member, whatever state the volume is in.
		return s.join(ctx, l, h, js)
	}
	if h != nil && h.State == storage.StateReady {
		if len(h.Enrolment) == 0 {
			return fmt.Errorf("%w: the data disk was set up without cluster enrolment data, so it cannot be unlocked through the cluster (was it a bootstrap node's disk?)", storage.ErrRefused)
		}
		return s.join(ctx, l, h, nil)
	}
	return s.register(ctx, l, nil)
}

func (c *Config) nodeStatus() *clusterpb.NodeStatus {
	s := &clusterpb.NodeStatus{Version: c.Version, BootTimeUnixNanos: c.BootTime.UnixNano()}
	if st, ok := c.Network.Status(); ok && st.Address.IsValid() {
		s.Addresses = []string{st.Address.Addr().String()}
	}
	return s
}

func (c *Config) port() int {
	if c.curatorPort != 0 {
		return c.curatorPort
	}
	return layout.CuratorPort
}

// endpoints are the curators to try: the directory's first (it is newer),
// then those in the node parameters.
func (c *Config) endpoints(dir *clusterpb.ClusterDirectory) []string {
	var out []string
	seen := map[string]bool{}
	add := func(e string) {
		if !seen[e] {
			seen[e] = true
			out = append(out, e)
		}
	}
	for _, n := range dir.GetNodes() {
		for _, a := range n.GetAddresses() {
			add(net.JoinHostPort(a, strconv.Itoa(c.port())))
		}
	}
	for _, e := range c.Parameters.GetRegister().GetCuratorEndpoints() {
		add(e)
	}
	return out
}

// register: ticket → NEW → (owner approves) → commit → credentials and the
// cluster unlock key → set up the data volume. The node's keys are sealed
// into the data disk header (storage.Reserve) before the first
// RegisterNode, so a node that reboots while it waits for approval comes
// back with the same identity; resume is that pending state, nil for a
// new registration.
func (s *Service) register(ctx context.Context, l *slog.Logger, resume *joinState) error {
	reg := s.Parameters.GetRegister()
	ca, err := x509.ParseCertificate(reg.GetClusterCaCertificate())
	if err != nil {
		return fmt.Errorf("cluster CA certificate in the node parameters: %w", err)
	}
	nodeKey, joinKey, err := s.registrationKeys(l, ca, resume)
	if err != nil {
		return err
	}
	id := identity.NodeID(nodeKey.Public().(ed25519.PublicKey))
	eph, err := identity.EphemeralCertificate(nodeKey)
	if err != nil {
		return err
	}
	tlsCfg := identity.ClientTLSConfig(identity.NewTrust(ca), eph, identity.ServerCurator)
	endpoints := s.endpoints(nil)
	l.Info("registering with the cluster", "node", id, "curators", endpoints, "tpm", s.TPMUsage.String())

	err = s.untilAccepted(ctx, l, "registration", endpoints, tlsCfg, func(ctx context.Context, cc *grpc.ClientConn, _ tls.ConnectionState) error {
		_, err := clusterpb.NewCuratorClient(cc).RegisterNode(ctx, &clusterpb.RegisterNodeRequest{
			RegisterTicket: reg.GetRegisterTicket(), Status: s.nodeStatus(), TpmUsage: s.TPMUsage,
			StorageSecurity: storageSecurity(s.Disk.Mode),
		})
		return err
	})
	if err != nil {
		return err
	}
	l.Info("registered: waiting for the owner to approve this node", "node", id, "approve_with", "plinthctl node approve "+id)

	var commit *clusterpb.CommitNodeResponse
	lastReminder := time.Now()
	for commit == nil {
		err = s.untilAccepted(ctx, l, "commit", endpoints, tlsCfg, func(ctx context.Context, cc *grpc.ClientConn, st tls.ConnectionState) error {
			proof, err := identity.SessionProof(joinKey, st, identity.ExporterCommitNode, nil)
			if err != nil {
				return err
			}
			commit, err = clusterpb.NewCuratorClient(cc).CommitNode(ctx, &clusterpb.CommitNodeRequest{
				JoinPublicKey: joinKey.Public().(ed25519.PublicKey), JoinKeyProof: proof,
			})
			if rpc.Reason(err) == clusterpb.ErrorReason_NODE_NOT_APPROVED {
				// Not approved yet: expected, not a refusal.
				return errNotYet
			}
			return err
		})
		if errors.Is(err, errNotYet) {
			if time.Since(lastReminder) > approvalReminder {
				l.Info("still waiting for approval", "node", id)
				lastReminder = time.Now()
			}
			if err := supervisor.Sleep(ctx, approvalPoll); err != nil {
				return err
			}
			continue
		}
		if err != nil {
			return err
		}
	}
	creds, err := identity.NewCredentials(nodeKey, commit.GetNodeCertificate(), commit.GetCaCertificate())
	if err != nil {
		return fmt.Errorf("credentials from the curator: %w", err)
	}
	if !creds.CA.Equal(ca) {
		return fmt.Errorf("%w: the curator answered with a CA other than the one in the node parameters", storage.ErrRefused)
	}
	l.Info("approved and committed: node certificate received", "node", id)
	dir := s.clusterDirectory(ctx, l, creds, endpoints)

	js := &joinState{JoinKey: joinKey, CA: creds.CA, Directory: dir, Node: creds}
	blob, err := js.seal(s.Keys)
	if err != nil {
		return err
	}
	s.remember(js, commit.GetClusterUnlockKey())
	// The join state (with the node's credentials) goes into the header
	// at the start of the volume setup: from then on a crash at any point
	// brings the node back through join, never through a second
	// registration that would orphan this one.
	return s.openAndProvide(ctx, l, commit.GetClusterUnlockKey(), js, blob, s.rs.ProvideRegisterData)
}

// registrationKeys are the node and join keys to register with: the
// pending ones from before a reboot, or new ones, sealed into the data
// disk header before anything is sent.
func (c *Config) registrationKeys(l *slog.Logger, ca *x509.Certificate, resume *joinState) (node, join ed25519.PrivateKey, err error) {
	if resume != nil {
		if !resume.CA.Equal(ca) {
			return nil, nil, fmt.Errorf("%w: the pending registration is for another cluster CA than the node parameters name", storage.ErrRefused)
		}
		l.Info("resuming the registration begun before a reboot", "node", identity.NodeID(resume.PendingNodeKey.Public().(ed25519.PublicKey)))
		return resume.PendingNodeKey, resume.JoinKey, nil
	}
	if _, node, err = ed25519.GenerateKey(rand.Reader); err != nil {
		return nil, nil, err
	}
	if _, join, err = ed25519.GenerateKey(rand.Reader); err != nil {
		return nil, nil, err
	}
	pending := &joinState{JoinKey: join, CA: ca, Directory: &clusterpb.ClusterDirectory{}, PendingNodeKey: node}
	blob, err := pending.seal(c.Keys)
	if err != nil {
		return nil, nil, err
	}
	if err := storage.Reserve(c.Disk, blob); err != nil {
		return nil, nil, fmt.Errorf("keeping the registration keys in the data disk header: %w", err)
	}
	return node, join, nil
}

// join: a node set up before comes back: join key → cluster unlock key →
// open the data volume → its saved credentials. js is the unsealed join
// state of h, or nil to unseal it here.
func (s *Service) join(ctx context.Context, l *slog.Logger, h *storage.Header, js *joinState) error {
	if js == nil {
		var err error
		if js, err = unsealJoinState(s.Keys, h.Enrolment); err != nil {
			return fmt.Errorf("%w: %v", storage.ErrRefused, err)
		}
	}
	eph, err := identity.EphemeralCertificate(js.JoinKey)
	if err != nil {
		return err
	}
	endpoints := s.endpoints(js.Directory)
	cuk := js.ClusterUnlockKey
	if cuk != nil {
		l.Info("consensus member: the cluster unlock key is sealed locally, opening the data volume without the cluster")
		s.remember(js, cuk)
		return s.openAndProvide(ctx, l, cuk, js, h.Enrolment, s.rs.ProvideJoinData)
	}
	l.Info("rejoining the cluster with the sealed join key", "curators", endpoints)
	err = s.untilAccepted(ctx, l, "join", endpoints, identity.ClientTLSConfig(identity.NewTrust(js.CA), eph, identity.ServerCurator), func(ctx context.Context, cc *grpc.ClientConn, st tls.ConnectionState) error {
		proof, err := identity.SessionProof(js.JoinKey, st, identity.ExporterJoinNode, nil)
		if err != nil {
			return err
		}
		resp, err := clusterpb.NewCuratorClient(cc).JoinNode(ctx, &clusterpb.JoinNodeRequest{UsageProof: proof})
		if err == nil {
			cuk = resp.GetClusterUnlockKey()
		}
		return err
	})
	if err != nil {
		return err
	}
	l.Info("cluster unlock key received")
	s.remember(js, cuk)
	return s.openAndProvide(ctx, l, cuk, js, h.Enrolment, s.rs.ProvideJoinData)
}

// openAndProvide opens (or sets up) the data volume, makes sure the node's
// credentials are on it and hands them to the Role Server. enrolment is
// what a (re)started setup writes into the header. Opening is attempted
// again only while it failed before changing anything (a failure after
// the volume was mapped needs a reboot, and says so); saving the
// credentials is retried on its own.
func (s *Service) openAndProvide(ctx context.Context, l *slog.Logger, cuk []byte, js *joinState, enrolment []byte,
	provide func(*identity.Credentials, *clusterpb.ClusterDirectory)) error {
	err := s.retryLocal(ctx, l, "open the data volume", func() error {
		err := s.openVolume(ctx, cuk, enrolment)
		if err != nil && s.volumeTouched() {
			l.Error("the data volume is half open; reboot the node to retry (nothing on it is changed)", "err", err)
			<-ctx.Done()
			return ctx.Err()
		}
		return err
	})
	if err != nil {
		return err
	}
	dir := s.Root.Data.Node.Credentials.Path()
	creds, err := identity.Load(dir)
	switch {
	case err == nil:
	case errors.Is(err, fs.ErrNotExist) && js.Node != nil:
		// Committed, but the node went down before saving them.
		creds = js.Node
		if err := s.retryLocal(ctx, l, "save the node credentials", func() error { return creds.Save(dir) }); err != nil {
			return err
		}
	default:
		return fmt.Errorf("node credentials on the data volume: %w", err)
	}
	l.Info("node credentials loaded", "node", creds.ID())
	provide(creds, js.Directory)
	return nil
}

func (c *Config) openVolume(ctx context.Context, cuk, enrolment []byte) error {
	cfg := c.Disk
	cfg.ClusterUnlockKey, cfg.Enrolment = cuk, enrolment
	r, err := storage.Open(ctx, cfg)
	if err != nil {
		return err
	}
	return c.VolumeOpened(r)
}

// volumeTouched reports whether an earlier attempt got as far as mapping
// the volume, after which Open cannot simply run again.
func (c *Config) volumeTouched() bool {
	_, err := os.Stat("/dev/mapper/" + storage.MappedName)
	return err == nil
}

// clusterDirectory asks the cluster where its curators are, now that the
// node has credentials; without an answer the parameters' endpoints stay
// the only way back after a reboot.
func (c *Config) clusterDirectory(ctx context.Context, l *slog.Logger, creds *identity.Credentials, endpoints []string) *clusterpb.ClusterDirectory {
	var dir *clusterpb.ClusterDirectory
	cctx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	err := c.untilAccepted(cctx, l, "cluster directory", endpoints, creds.ClientTLSConfig(identity.ServerCurator), func(ctx context.Context, cc *grpc.ClientConn, _ tls.ConnectionState) error {
		info, err := clusterpb.NewManagementClient(cc).GetClusterInfo(ctx, &clusterpb.GetClusterInfoRequest{})
		if err == nil {
			dir = info.GetDirectory()
		}
		return err
	})
	if err != nil {
		l.Warn("no cluster directory; the node parameters' curator endpoints are used to rejoin", "err", err)
		return &clusterpb.ClusterDirectory{}
	}
	return dir
}

var errNotYet = errors.New("not yet")

// untilAccepted calls fn on one curator after another until one accepts.
// Unreachable curators and followers (UNAVAILABLE) are skipped; a refusal
// is logged with the cluster's reason and retried slowly, since only a
// person can change it (a new ticket, an approval, a policy).
func (c *Config) untilAccepted(ctx context.Context, l *slog.Logger, what string, endpoints []string, tlsCfg *tls.Config,
	fn func(context.Context, *grpc.ClientConn, tls.ConnectionState) error) error {
	if len(endpoints) == 0 {
		return fmt.Errorf("%s: no curator endpoints known", what)
	}
	for attempt := 0; ; attempt++ {
		var refused error
		for _, ep := range endpoints {
			err := callOnce(ctx, ep, tlsCfg, fn)
			switch code := status.Code(err); {
			case err == nil, errors.Is(err, errNotYet):
				return err
			case ctx.Err() != nil:
				return ctx.Err()
			case code == codes.Unavailable || code == codes.DeadlineExceeded || code == codes.Canceled:
				if attempt%15 == 0 {
					l.Warn(what+": curator not reachable or not the leader", "curator", ep, "err", status.Convert(err).Message())
				}
			default:
				refused = err
				l.Error(what+" refused by the cluster", "curator", ep, "code", code.String(), "reason", status.Convert(err).Message())
			}
		}
		wait := retryUnavailable
		if refused != nil {
			wait = retryRefused
		}
		if err := supervisor.Sleep(ctx, wait); err != nil {
			return err
		}
	}
}

func callOnce(ctx context.Context, endpoint string, tlsCfg *tls.Config, fn func(context.Context, *grpc.ClientConn, tls.ConnectionState) error) error {
	creds := identity.NewCapturingCredentials(tlsCfg)
	cc, err := grpc.NewClient(endpoint, grpc.WithTransportCredentials(creds), rpc.ClientKeepalive(), rpc.ClientConnectParams())
	if err != nil {
		return status.Error(codes.Unavailable, err.Error())
	}
	defer cc.Close()
	ctx, cancel := context.WithTimeout(ctx, 15*time.Second)
	defer cancel()
	// Connect first: session-bound proofs need the TLS state before the
	// request is built.
	cc.Connect()
	for s := cc.GetState(); s != connectivity.Ready; s = cc.GetState() {
		if s == connectivity.TransientFailure {
			return status.Error(codes.Unavailable, "cannot connect to "+endpoint)
		}
		if !cc.WaitForStateChange(ctx, s) {
			return status.Error(codes.Unavailable, "timed out connecting to "+endpoint)
		}
	}
	st, ok := creds.State()
	if !ok {
		return status.Error(codes.Unavailable, "no TLS session with "+endpoint)
	}
	return fn(ctx, cc, st)
}

func (c *Config) retryLocal(ctx context.Context, l *slog.Logger, what string, fn func() error) error {
	for {
		err := fn()
		if err == nil {
			return nil
		}
		l.Error(what+" failed; retrying", "err", err)
		if err := supervisor.Sleep(ctx, retryRefused); err != nil {
			return err
		}
	}
}

// storageSecurity is how a data partition of mode m is protected, as the
// cluster policy names it.
func storageSecurity(m storage.Mode) clusterpb.StorageSecurity {
	switch m {
	case storage.ModeCrypt:
		return clusterpb.StorageSecurity_STORAGE_SECURITY_ENCRYPTED
	case storage.ModeAuthenticated:
		return clusterpb.StorageSecurity_STORAGE_SECURITY_AUTHENTICATED
	}
	return clusterpb.StorageSecurity_STORAGE_SECURITY_UNSPECIFIED
}
