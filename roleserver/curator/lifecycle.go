package curator

import (
	"context"
	"crypto/ed25519"
	"crypto/rand"
	"crypto/subtle"
	"crypto/x509"
	"math/big"
	"net"
	"net/netip"
	"slices"
	"strings"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/peer"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"

	"plinth.dev/plinth/api/clusterpb"
	"plinth.dev/plinth/platform/event"
	"plinth.dev/plinth/roleserver/identity"
	"plinth.dev/plinth/roleserver/rpc"
)

// checkTPMPolicy refuses a node the cluster configuration forbids.
// Unspecified counts as "no TPM" so a broken node cannot pass as
// TPM-protected.
func checkTPMPolicy(cfg *clusterpb.ClusterConfiguration, usage clusterpb.NodeTPMUsage) error {
	if usage == clusterpb.NodeTPMUsage_NODE_TPM_USAGE_USED || cfg.GetAllowNodesWithoutTpm() {
		return nil
	}
	return status.Errorf(codes.FailedPrecondition,
		"cluster policy requires nodes to seal their secrets in a TPM (allow_nodes_without_tpm is false), node reports tpm_usage %s", usage)
}

// checkStoragePolicy refuses a node whose data partition is protected
// less than the cluster configuration's minimum (the enum is ordered by
// protection). Unspecified, from a node too old to say, counts as
// encrypted: every data partition is at least that. Guarded by
// TestRegisterStoragePolicy.
func checkStoragePolicy(cfg *clusterpb.ClusterConfiguration, sec clusterpb.StorageSecurity) error {
	minimum := cfg.GetMinimumStorageSecurity()
	if sec == clusterpb.StorageSecurity_STORAGE_SECURITY_UNSPECIFIED {
		sec = clusterpb.StorageSecurity_STORAGE_SECURITY_ENCRYPTED
	}
	if minimum == clusterpb.StorageSecurity_STORAGE_SECURITY_UNSPECIFIED || sec >= minimum {
		return nil
	}
	return status.Errorf(codes.FailedPrecondition,
		"cluster policy requires data partitions protected at least as %s (minimum_storage_security), node reports %s", minimum, sec)
}

// Bounds of what a registering node may put into etcd.
const (
	// maxNewNodes is how many nodes may wait for approval at once; more
	// registrations are refused (REGISTRATION_QUEUE_FULL) until the owner
	// approves or decommissions some, so a leaked ticket cannot fill etcd.
	maxNewNodes = 32
	// maxNewPerAddress is how many of them may have registered from one
	// address (Node.observed_addresses of a NEW record is where it
	// registered from): the register ticket lies on every node's ESP
	// and in network-boot command lines, and one host on the LAN with it
	// must not hold the whole queue.
	maxNewPerAddress = 4
	// maxStatusSize bounds a NodeStatus as stored.
	maxStatusSize  = 4 << 10
	maxAddresses   = 16
	maxVersionSize = 256
	maxProblems    = 16
)

// checkStatus refuses a node status too large to store or with addresses
// that are not IP addresses.
func checkStatus(st *clusterpb.NodeStatus) error {
	if n := proto.Size(st); n > maxStatusSize {
		return status.Errorf(codes.InvalidArgument, "status has %d bytes, at most %d are accepted", n, maxStatusSize)
	}
	if len(st.GetAddresses()) > maxAddresses {
		return status.Errorf(codes.InvalidArgument, "status has %d addresses, at most %d are accepted", len(st.GetAddresses()), maxAddresses)
	}
	for _, a := range st.GetAddresses() {
		if _, err := netip.ParseAddr(a); err != nil {
			return status.Errorf(codes.InvalidArgument, "status address %q is not an IP address", a)
		}
	}
	if len(st.GetVersion()) > maxVersionSize {
		return status.Errorf(codes.InvalidArgument, "status version has %d bytes, at most %d are accepted", len(st.GetVersion()), maxVersionSize)
	}
	if len(st.GetProblems()) > maxProblems {
		return status.Errorf(codes.InvalidArgument, "status has %d problems, at most %d are accepted", len(st.GetProblems()), maxProblems)
	}
	return nil
}

func (c curatorServer) RegisterNode(ctx context.Context, req *clusterpb.RegisterNodeRequest) (*clusterpb.RegisterNodeResponse, error) {
	const method = "RegisterNode"
	p := rpc.PeerFrom(ctx)
	// Served by every member, like Management: a node that registers
	// knows only the curators in its parameters, and every write here is
	// an etcd transaction that holds without a leader's guard.
	var t guard
	kv, _, err := c.backend()
	if err != nil {
		return nil, err
	}
	ticket, _, err := getValue(ctx, kv, keyTicket)
	if err != nil {
		return nil, etcdErr(method, err)
	}
	if len(ticket) == 0 || subtle.ConstantTimeCompare(ticket, req.RegisterTicket) != 1 {
		return nil, rpc.Error(codes.PermissionDenied, clusterpb.ErrorReason_INVALID_TICKET, "register ticket is not valid for this cluster")
	}
	if err := checkStatus(req.Status); err != nil {
		return nil, err
	}
	cfg, err := loadConfiguration(ctx, kv)
	if err != nil {
		return nil, err
	}
	if err := checkTPMPolicy(cfg, req.TpmUsage); err != nil {
		return nil, err
	}
	if err := checkStoragePolicy(cfg, req.StorageSecurity); err != nil {
		return nil, err
	}
	id := identity.NodeID(p.PublicKey)
	from := c.observed(ctx, id)
	for attempt := 0; attempt < 5; attempt++ {
		n, _, err := getNode(ctx, kv, id)
		if err != nil {
			return nil, etcdErr(method, err)
		}
		if n != nil {
			if !p.PublicKey.Equal(ed25519.PublicKey(n.PublicKey)) {
				return nil, status.Errorf(codes.PermissionDenied, "node ID %s is taken by another key", id)
			}
			if n.State == clusterpb.NodeState_NODE_STATE_DECOMMISSIONED {
				return nil, rpc.Error(codes.PermissionDenied, clusterpb.ErrorReason_NODE_DECOMMISSIONED, "node %s was decommissioned: its key can never register again", id)
			}
			// NEW, STANDBY or UP: registered already, nothing changes.
			return &clusterpb.RegisterNodeResponse{}, nil
		}
		waiting, fromHere, err := countNew(ctx, kv, from)
		switch {
		case err != nil:
			return nil, err
		case waiting >= maxNewNodes:
			return nil, rpc.Error(codes.ResourceExhausted, clusterpb.ErrorReason_REGISTRATION_QUEUE_FULL,
				"%d nodes already wait for approval (at most %d may): the owner must approve or decommission some first (or rotate the ticket if it leaked)", waiting, maxNewNodes)
		case fromHere >= maxNewPerAddress:
			return nil, rpc.Error(codes.ResourceExhausted, clusterpb.ErrorReason_REGISTRATION_QUEUE_FULL,
				"%d nodes that registered from %s already wait for approval (at most %d from one address may): the owner must approve or decommission some first (or rotate the ticket if it leaked)",
				fromHere, strings.Join(from, ", "), maxNewPerAddress)
		}
		created, err := createNode(ctx, kv, t, &clusterpb.Node{
			Id:                id,
			PublicKey:         p.PublicKey,
			State:             clusterpb.NodeState_NODE_STATE_NEW,
			Status:            req.Status,
			TpmUsage:          req.TpmUsage,
			ObservedAddresses: from,
		})
		if err != nil {
			return nil, err
		}
		if created {
			return &clusterpb.RegisterNodeResponse{}, nil
		}
	}
	return nil, status.Errorf(codes.Aborted, "node %s kept changing while registering; retry", id)
}

// countNew counts the nodes waiting for approval.
func countNew(ctx context.Context, kv clientv3.KV, from []string) (all, fromThere int, err error) {
	nodes, _, err := listNodes(ctx, kv)
	if err != nil {
		return 0, 0, err
	}
	for _, node := range nodes {
		if node.State != clusterpb.NodeState_NODE_STATE_NEW {
			continue
		}
		all++
		if slices.ContainsFunc(node.GetObservedAddresses(), func(a string) bool { return slices.Contains(from, a) }) {
			fromThere++
		}
	}
	return all, fromThere, nil
}

// observed is where the caller of ctx (node id) connects from, as the
// curator records it (Config.Observe); nil if it cannot tell.
func (c curatorServer) observed(ctx context.Context, id string) []string {
	src, ok := peer.FromContext(ctx)
	if !ok {
		return nil
	}
	tcp, ok := src.Addr.(*net.TCPAddr)
	if !ok {
		return nil
	}
	var out []string
	for _, ip := range c.cfg.Observe(id, tcp.IP) {
		out = append(out, ip.String())
	}
	return out
}

// createNode writes a new node record if none exists; false if one
// appeared meanwhile.
func createNode(ctx context.Context, kv clientv3.KV, g guard, n *clusterpb.Node) (bool, error) {
	val, err := marshalNode(n)
	if err != nil {
		return false, internalErr("encoding node", err)
	}
	cmps := []clientv3.Cmp{clientv3.Compare(clientv3.CreateRevision(nodeKey(n.Id)), "=", 0)}
	if g != nil {
		cmps = append(cmps, g.cmps()...)
	}
	resp, err := kv.Txn(ctx).If(cmps...).Then(clientv3.OpPut(nodeKey(n.Id), val)).Commit()
	if err != nil {
		return false, etcdErr("writing node "+n.Id, err)
	}
	if !resp.Succeeded && g != nil {
		return false, g.lost()
	}
	return resp.Succeeded, nil
}

// CommitNode authorizes before it does any work: the session proof and
// the node record's state and key are checked first (authorizeCommit);
// only then is the CA loaded, a key generated and a certificate signed.
func (c curatorServer) CommitNode(ctx context.Context, req *clusterpb.CommitNodeRequest) (*clusterpb.CommitNodeResponse, error) {
	p := rpc.PeerFrom(ctx)
	// Served by every member, like RegisterNode.
	kv, _, err := c.backend()
	if err != nil {
		return nil, err
	}
	cm, err := authorizeCommit(ctx, kv, p, req)
	if err != nil {
		return nil, err
	}

	// Authorized: now the work.
	ca, err := loadCA(ctx, kv)
	if err != nil {
		return nil, err
	}
	cert, err := identity.IssueNodeCertificate(ca, p.PublicKey)
	if err != nil {
		return nil, internalErr("issuing node certificate", err)
	}
	var cuk []byte
	if cm.again {
		cuk, err = cm.repeat(ctx, kv, cert)
	} else {
		cuk, err = cm.commit(ctx, kv, cert)
	}
	if err != nil {
		return nil, err
	}
	return &clusterpb.CommitNodeResponse{
		CaCertificate:    ca.Certificate.Raw,
		NodeCertificate:  cert.Raw,
		ClusterUnlockKey: cuk,
	}, nil
}

// commitNodeMethod names CommitNode in its errors.
const commitNodeMethod = "CommitNode"

// nodeCommit is one authorized CommitNode call: the caller p commits node
// id with the join key joinPub.
type nodeCommit struct {
	id      string
	p       *identity.Peer
	joinPub ed25519.PublicKey
	// again: the node is UP already and committed with this very join
	// key; it repeats the call because the reply was lost.
	again bool
}

// authorizeCommit checks that the caller may commit: it proves the join
// key on this connection, its node is registered for its key and
// approved, the join key is not the owner's, and a node that is UP
// already committed with this join key.
func authorizeCommit(ctx context.Context, kv clientv3.KV, p *identity.Peer, req *clusterpb.CommitNodeRequest) (*nodeCommit, error) {
	joinPub := ed25519.PublicKey(req.JoinPublicKey)
	if len(joinPub) != ed25519.PublicKeySize {
		return nil, status.Errorf(codes.InvalidArgument, "join_public_key has %d bytes, want %d", len(joinPub), ed25519.PublicKeySize)
	}
	if err := identity.VerifySessionProof(joinPub, p.TLS, identity.ExporterCommitNode, nil, req.JoinKeyProof); err != nil {
		return nil, status.Errorf(codes.PermissionDenied, "join_key_proof does not prove possession of the join key on this connection: %v", err)
	}
	id := identity.NodeID(p.PublicKey)
	n, _, err := getNode(ctx, kv, id)
	if err != nil {
		return nil, etcdErr(commitNodeMethod, err)
	}
	if err := commitAllowed(n, id, p); err != nil {
		return nil, err
	}
	if owner, err := ownerKeyIs(ctx, kv, joinPub); err != nil {
		return nil, err
	} else if owner {
		return nil, status.Error(codes.InvalidArgument, "join_public_key is the owner key")
	}
	cm := &nodeCommit{id: id, p: p, joinPub: joinPub, again: n.State == clusterpb.NodeState_NODE_STATE_UP}
	if cm.again {
		// Repeated by the node that committed (it proved both its node
		// key and its join key): its reply was lost. Anyone else is
		// refused here, before anything is issued.
		owner, _, err := getValue(ctx, kv, joinKeyKey(joinPub))
		if err != nil {
			return nil, etcdErr(commitNodeMethod, err)
		}
		if string(owner) != id {
			return nil, status.Errorf(codes.FailedPrecondition, "node %s already committed (state UP) with another join key: credentials are handed out only once", id)
		}
	}
	return cm, nil
}

// repeat records the certificate issued again and returns the cluster
// unlock key the node got the first time.
func (cm *nodeCommit) repeat(ctx context.Context, kv clientv3.KV, cert *x509.Certificate) ([]byte, error) {
	if _, err := kv.Txn(ctx).Then(recordCert(cm.id, certNode, cert)).Commit(); err != nil {
		return nil, etcdErr("recording node certificate", err)
	}
	cuk, _, err := getValue(ctx, kv, unlockKeyKey(cm.id))
	if err != nil {
		return nil, etcdErr(commitNodeMethod, err)
	}
	return cuk, nil
}

// commit makes the node UP with a new cluster unlock key, in one
// transaction with its join key index and its certificate, and returns
// the key.
func (cm *nodeCommit) commit(ctx context.Context, kv clientv3.KV, cert *x509.Certificate) ([]byte, error) {
	cuk := make([]byte, 32)
	if _, err := rand.Read(cuk); err != nil {
		return nil, internalErr("generating cluster unlock key", err)
	}
	_, err := updateNode(ctx, kv, nil, cm.id, func(n *clusterpb.Node) ([]clientv3.Op, error) {
		// The record may have changed since it was checked above.
		if err := commitAllowed(n, cm.id, cm.p); err != nil {
			return nil, err
		}
		if n.State != clusterpb.NodeState_NODE_STATE_STANDBY {
			return nil, status.Errorf(codes.Aborted, "node %s changed to %s while committing; retry", cm.id, n.State)
		}
		if other, _, err := getValue(ctx, kv, joinKeyKey(cm.joinPub)); err != nil {
			return nil, etcdErr(commitNodeMethod, err)
		} else if other != nil {
			return nil, status.Errorf(codes.AlreadyExists, "join_public_key is already the join key of node %s", other)
		}
		n.State = clusterpb.NodeState_NODE_STATE_UP
		return []clientv3.Op{
			clientv3.OpPut(joinKeyKey(cm.joinPub), cm.id),
			clientv3.OpPut(unlockKeyKey(cm.id), string(cuk)),
			recordCert(cm.id, certNode, cert),
		}, nil
	}, clientv3.Compare(clientv3.CreateRevision(joinKeyKey(cm.joinPub)), "=", 0))
	if err != nil {
		return nil, err
	}
	return cuk, nil
}

// commitAllowed says whether the caller may commit node id (n its record):
// registered for this very key, approved, not decommissioned. UP is
// allowed (a repeated commit) and checked further by the caller.
func commitAllowed(n *clusterpb.Node, id string, p *identity.Peer) error {
	if n == nil {
		return status.Errorf(codes.NotFound, "node %s is not registered (call RegisterNode first)", id)
	}
	if !p.PublicKey.Equal(ed25519.PublicKey(n.PublicKey)) {
		return status.Errorf(codes.PermissionDenied, "node ID %s is registered for another key", id)
	}
	switch n.State {
	case clusterpb.NodeState_NODE_STATE_STANDBY, clusterpb.NodeState_NODE_STATE_UP:
		return nil
	case clusterpb.NodeState_NODE_STATE_NEW:
		return rpc.Error(codes.FailedPrecondition, clusterpb.ErrorReason_NODE_NOT_APPROVED, "node %s is not approved yet (state NEW): the owner must approve it first", id)
	case clusterpb.NodeState_NODE_STATE_DECOMMISSIONED:
		return rpc.Error(codes.PermissionDenied, clusterpb.ErrorReason_NODE_DECOMMISSIONED, "node %s is decommissioned", id)
	}
	return status.Errorf(codes.FailedPrecondition, "node %s is in state %s", id, n.State)
}

// ownerKeyIs reports whether pub is the owner key.
func ownerKeyIs(ctx context.Context, kv clientv3.KV, pub ed25519.PublicKey) (bool, error) {
	owner, _, err := getValue(ctx, kv, keyOwnerKey)
	if err != nil {
		return false, etcdErr("reading owner key", err)
	}
	return len(owner) == ed25519.PublicKeySize && ed25519.PublicKey(owner).Equal(pub), nil
}

func (c curatorServer) JoinNode(ctx context.Context, req *clusterpb.JoinNodeRequest) (*clusterpb.JoinNodeResponse, error) {
	const method = "JoinNode"
	p := rpc.PeerFrom(ctx)
	// Any member answers (see RegisterNode): a rebooted node may know
	// only curators that are followers now.
	kv, _, err := c.backend()
	if err != nil {
		return nil, err
	}
	idb, _, err := getValue(ctx, kv, joinKeyKey(p.PublicKey))
	if err != nil {
		return nil, etcdErr(method, err)
	}
	if idb == nil {
		return nil, status.Error(codes.NotFound, "the caller's key is not the join key of any node")
	}
	id := string(idb)
	n, _, err := getNode(ctx, kv, id)
	if err != nil {
		return nil, etcdErr(method, err)
	}
	switch {
	case n == nil:
		return nil, status.Errorf(codes.NotFound, "node %s of this join key is unknown", id)
	case n.State == clusterpb.NodeState_NODE_STATE_DECOMMISSIONED:
		return nil, rpc.Error(codes.PermissionDenied, clusterpb.ErrorReason_NODE_DECOMMISSIONED, "node %s is decommissioned and may not rejoin", id)
	case n.State != clusterpb.NodeState_NODE_STATE_UP:
		return nil, status.Errorf(codes.FailedPrecondition, "node %s is %s, not UP", id, n.State)
	}
	if err := identity.VerifySessionProof(p.PublicKey, p.TLS, identity.ExporterJoinNode, nil, req.UsageProof); err != nil {
		return nil, status.Errorf(codes.PermissionDenied, "usage_proof is not valid for this connection: %v", err)
	}
	cuk, _, err := getValue(ctx, kv, unlockKeyKey(id))
	if err != nil {
		return nil, etcdErr(method, err)
	}
	if cuk == nil {
		return nil, status.Errorf(codes.FailedPrecondition, "no cluster unlock key is kept for node %s (the bootstrap node's disk is not tied to the cluster)", id)
	}
	return &clusterpb.JoinNodeResponse{ClusterUnlockKey: cuk}, nil
}

func (c curatorServer) UpdateNodeStatus(ctx context.Context, req *clusterpb.UpdateNodeStatusRequest) (*clusterpb.UpdateNodeStatusResponse, error) {
	const method = "UpdateNodeStatus"
	p := rpc.PeerFrom(ctx)
	if req.NodeId != p.NodeID {
		return nil, status.Errorf(codes.PermissionDenied, "%s: node %s may only update its own status, not that of %q", method, p.NodeID, req.NodeId)
	}
	if err := checkStatus(req.Status); err != nil {
		return nil, err
	}
	t, err := c.leaderTerm()
	if err != nil {
		return nil, err
	}
	kv, _, err := c.backend()
	if err != nil {
		return nil, err
	}
	observed := c.observed(ctx, p.NodeID)
	_, err = updateNode(ctx, kv, t, p.NodeID, func(n *clusterpb.Node) ([]clientv3.Op, error) {
		if n == nil || n.State != clusterpb.NodeState_NODE_STATE_UP {
			return nil, status.Errorf(codes.FailedPrecondition, "node %s is not UP", p.NodeID)
		}
		if proto.Equal(n.Status, req.Status) && (len(observed) == 0 || slices.Equal(n.ObservedAddresses, observed)) {
			return nil, errNoChange // the periodic resend of an unchanged status writes nothing
		}
		n.Status = req.Status
		if len(observed) > 0 {
			n.ObservedAddresses = observed
		}
		return nil, nil
	})
	if err != nil {
		return nil, err
	}
	return &clusterpb.UpdateNodeStatusResponse{}, nil
}

// observeAddress is where the curator of node self saw node id, which
// connected from source: source itself, unless it is loopback, which
// only a node's own curator sees it from: then self's interface
// addresses (local), and for any other node nothing (a port forward to
// the curator, say: its real address is unknown).
func observeAddress(self, id string, source net.IP, local func() []net.IP) []net.IP {
	switch {
	case source == nil || source.IsUnspecified():
		return nil
	case !source.IsLoopback():
		return []net.IP{source}
	case id == self:
		return local()
	}
	return nil
}

// interfaceAddresses are this machine's unicast addresses but loopback
// and link-local ones.
func interfaceAddresses() []net.IP {
	addrs, err := net.InterfaceAddrs()
	if err != nil {
		return nil
	}
	var out []net.IP
	for _, a := range addrs {
		if n, ok := a.(*net.IPNet); ok && !n.IP.IsLoopback() && !n.IP.IsLinkLocalUnicast() && !n.IP.IsMulticast() {
			out = append(out, n.IP)
		}
	}
	return out
}

func (c curatorServer) Heartbeat(srv clusterpb.Curator_HeartbeatServer) error {
	ctx := srv.Context()
	p := rpc.PeerFrom(ctx)
	t, err := c.leaderTerm()
	if err != nil {
		return err
	}
	kv, _, err := c.backend()
	if err != nil {
		return err
	}
	type received struct {
		req *clusterpb.HeartbeatRequest
		err error
	}
	reqs := make(chan received)
	done := make(chan struct{})
	defer close(done)
	go func() {
		for {
			req, err := srv.Recv()
			select {
			case reqs <- received{req, err}:
			case <-done:
				return
			}
			if err != nil {
				return
			}
		}
	}()
	for {
		var req *clusterpb.HeartbeatRequest
		select {
		case <-t.ctx.Done():
			return errNotLeader("not the leader any more")
		case r := <-reqs:
			if r.err != nil {
				return nil // the node closed the stream or went away
			}
			req = r.req
		}
		if err := c.heartbeat(ctx, kv, t, p.NodeID); err != nil {
			return err
		}
		// Every request is answered (the node takes silence for a dead
		// leader), with the CRL when the node's is older.
		resp := &clusterpb.HeartbeatResponse{}
		if crl := c.currentCRL(); crl != nil && crl.List.Number.Cmp(new(big.Int).SetUint64(req.GetCrlNumber())) > 0 {
			resp.Crl = crl.Raw
		}
		if err := srv.Send(resp); err != nil {
			return err
		}
	}
}

// heartbeat records one heartbeat, writing it to etcd at most once per
// heartbeatWriteInterval.
func (s *Service) heartbeat(ctx context.Context, kv clientv3.KV, t *term, id string) error {
	now := time.Now()
	s.hbMu.Lock()
	h := s.hb[id]
	if h == nil {
		h = &heartbeatState{}
		s.hb[id] = h
	}
	h.seen = now
	write := now.Sub(h.written) >= s.heartbeatWriteInterval()
	if write {
		h.written = now
	}
	s.hbMu.Unlock()
	if !write {
		return nil
	}
	resp, err := kv.Txn(ctx).If(t.cmps()...).Then(clientv3.OpPut(heartbeatKey(id), formatNanos(now.UnixNano()))).Commit()
	if err != nil {
		return etcdErr("storing heartbeat", err)
	}
	if !resp.Succeeded {
		return errNotLeader("not the leader any more")
	}
	return nil
}

// GetCurrentLeader answers with the leader as this curator sees it, and
// again whenever the answer changes: another leader, or the leader's node
// record (its address). Between answers it waits on the leader value and
// on an etcd watch of the leader's record, and reads nothing: it used to
// re-read the record every 5 s per stream, which under load was the
// curator's most frequent slow etcd read left. A failed read (etcd
// electing a leader) is retried after leaderRecheck; the stream ends
// after leaderReadAttempts failures in a row.
func (c curatorServer) GetCurrentLeader(req *clusterpb.GetCurrentLeaderRequest, srv clusterpb.Curator_GetCurrentLeaderServer) error {
	ctx := srv.Context()
	w := c.leader.Watch()
	defer w.Close()
	var last *clusterpb.GetCurrentLeaderResponse
	failed := 0
	li, err := w.Get(ctx)
	for err == nil {
		wctx, cancel := context.WithCancel(ctx)
		var record clientv3.WatchChan // nil without a leader: only a new one wakes
		var recheck <-chan time.Time
		if li != nil {
			var resp *clusterpb.GetCurrentLeaderResponse
			resp, record, err = c.leaderResponse(wctx, li)
			switch {
			case err != nil && ctx.Err() == nil && failed+1 < leaderReadAttempts:
				failed++
				err, recheck = nil, time.After(leaderRecheck)
			case err == nil:
				failed = 0
				if last == nil || !proto.Equal(resp, last) {
					err = srv.Send(resp)
					last = resp
				}
			}
		}
		if err == nil {
			li, err = nextLeaderChange(wctx, w, li, record, recheck)
		}
		cancel()
	}
	if ctx.Err() != nil {
		return ctx.Err()
	}
	return err
}

// How GetCurrentLeader retries: the pause before reading the leader's
// record again after a failed read or watch, and how many reads in a row
// may fail.
const (
	leaderRecheck      = 5 * time.Second
	leaderReadAttempts = 4
)

// leaderResponse reads the leader's address from its node record and
// watches the record from the revision read.
func (s *Service) leaderResponse(ctx context.Context, li *leaderInfo) (*clusterpb.GetCurrentLeaderResponse, clientv3.WatchChan, error) {
	kv, _, err := s.backend()
	if err != nil {
		return nil, nil, err
	}
	got, err := kv.Get(ctx, nodeKey(li.ID))
	if err != nil {
		return nil, nil, etcdErr("reading leader's node", err)
	}
	resp := &clusterpb.GetCurrentLeaderResponse{Id: li.ID, Port: li.Port}
	if len(got.Kvs) == 1 {
		n, err := unmarshalNode(got.Kvs[0].Value)
		if err != nil {
			return nil, nil, err
		}
		if a := n.GetStatus().GetAddresses(); len(a) > 0 {
			resp.Host = a[0]
		}
	}
	if li.ID == s.nodeID {
		_, err := s.leaderTerm()
		resp.ThisIsLeader = err == nil
	}
	return resp, kv.Watch(ctx, nodeKey(li.ID), clientv3.WithRev(got.Header.Revision+1)), nil
}

// nextLeaderChange waits until the leader value changes (and returns the
// new one), or the current leader's record does or recheck fires (and
// returns li again, to be read again). If the record's watch fails (etcd
// unreachable, the revision compacted), li is read again after
// leaderRecheck unless the leader changes first.
func nextLeaderChange(ctx context.Context, w event.Watcher[*leaderInfo], li *leaderInfo, record clientv3.WatchChan, recheck <-chan time.Time) (*leaderInfo, error) {
	gctx, cancel := context.WithCancel(ctx)
	defer cancel()
	type next struct {
		li  *leaderInfo
		err error
	}
	ch := make(chan next, 1)
	go func() {
		li, err := w.Get(gctx)
		ch <- next{li, err}
	}()
wait:
	for {
		select {
		case n := <-ch:
			return n.li, n.err
		case <-recheck:
			break wait
		case wr, ok := <-record:
			if ok && wr.Err() == nil {
				break wait
			}
			record, recheck = nil, time.After(leaderRecheck)
		}
	}
	cancel()
	if n := <-ch; n.err == nil {
		return n.li, nil // a new leader came at the same time
	}
	return li, ctx.Err()
}
