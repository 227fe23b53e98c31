package curator

import (
	"context"
	"crypto/ed25519"
	"errors"
	"fmt"

	clientv3 "go.etcd.io/etcd/client/v3"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"plinth.dev/plinth/api/clusterpb"
	"plinth.dev/plinth/roleserver/consensus"
	"plinth.dev/plinth/roleserver/consensus/client"
	"plinth.dev/plinth/roleserver/identity"
)

// Management is served by every member: it reads and writes etcd
// directly, with a compare-and-swap on each node record.

func (m managementServer) GetRegisterTicket(ctx context.Context, _ *clusterpb.GetRegisterTicketRequest) (*clusterpb.GetRegisterTicketResponse, error) {
	const method = "GetRegisterTicket"
	kv, _, err := m.backend()
	if err != nil {
		return nil, err
	}
	ticket, _, err := getValue(ctx, kv, keyTicket)
	if err != nil {
		return nil, etcdErr(method, err)
	}
	if ticket == nil {
		return nil, status.Error(codes.FailedPrecondition, "no register ticket: cluster not bootstrapped")
	}
	return &clusterpb.GetRegisterTicketResponse{Ticket: ticket}, nil
}

func (m managementServer) RotateRegisterTicket(ctx context.Context, _ *clusterpb.RotateRegisterTicketRequest) (*clusterpb.RotateRegisterTicketResponse, error) {
	kv, _, err := m.backend()
	if err != nil {
		return nil, err
	}
	ticket, err := newTicket()
	if err != nil {
		return nil, internalErr("generating a ticket", err)
	}
	resp, err := kv.Txn(ctx).If(clientv3.Compare(clientv3.CreateRevision(keyTicket), ">", 0)).
		Then(clientv3.OpPut(keyTicket, string(ticket))).Commit()
	if err != nil {
		return nil, etcdErr("writing the register ticket", err)
	}
	if !resp.Succeeded {
		return nil, status.Error(codes.FailedPrecondition, "no register ticket: cluster not bootstrapped")
	}
	return &clusterpb.RotateRegisterTicketResponse{Ticket: ticket}, nil
}

func (m managementServer) GetClusterInfo(ctx context.Context, _ *clusterpb.GetClusterInfoRequest) (*clusterpb.GetClusterInfoResponse, error) {
	kv, _, err := m.backend()
	if err != nil {
		return nil, err
	}
	nodes, _, err := listNodes(ctx, kv)
	if err != nil {
		return nil, err
	}
	cfg, err := loadConfiguration(ctx, kv)
	if err != nil {
		return nil, err
	}
	resp := &clusterpb.GetClusterInfoResponse{
		Directory:     directory(nodes),
		CaCertificate: m.cfg.Credentials.CA.Raw,
		Configuration: cfg,
	}
	crl, _, err := loadCRL(ctx, kv, m.cfg.Credentials.CA)
	if err != nil {
		return nil, err
	}
	if crl != nil {
		resp.Crl = crl.Raw
	}
	return resp, nil
}

// directory lists the UP consensus members, i.e. the nodes running a
// curator.
func directory(nodes []*clusterpb.Node) *clusterpb.ClusterDirectory {
	dir := &clusterpb.ClusterDirectory{}
	for _, n := range nodes {
		if n.State != clusterpb.NodeState_NODE_STATE_UP || n.GetRoles().GetConsensusMember() == nil {
			continue
		}
		dir.Nodes = append(dir.Nodes, &clusterpb.DirectoryNode{
			Id:        n.Id,
			PublicKey: n.PublicKey,
			Addresses: n.GetStatus().GetAddresses(),
		})
	}
	return dir
}

func (m managementServer) GetNodes(req *clusterpb.GetNodesRequest, srv clusterpb.Management_GetNodesServer) error {
	ctx := srv.Context()
	filter, err := parseFilter(req.Filter)
	if err != nil {
		return status.Errorf(codes.InvalidArgument, "filter: %v", err)
	}
	kv, st, err := m.backend()
	if err != nil {
		return err
	}
	nodes, _, err := listNodes(ctx, kv)
	if err != nil {
		return err
	}
	if err := m.withHealth(ctx, kv, nodes...); err != nil {
		return err
	}
	withMembership(ctx, st, nodes)
	for _, n := range nodes {
		if !filter(n) {
			continue
		}
		if err := srv.Send(n); err != nil {
			return err
		}
	}
	return nil
}

func (m managementServer) ApproveNode(ctx context.Context, req *clusterpb.ApproveNodeRequest) (*clusterpb.ApproveNodeResponse, error) {
	if len(req.PublicKey) != ed25519.PublicKeySize {
		return nil, status.Errorf(codes.InvalidArgument, "public_key has %d bytes, want %d", len(req.PublicKey), ed25519.PublicKeySize)
	}
	kv, _, err := m.backend()
	if err != nil {
		return nil, err
	}
	id := identity.NodeID(req.PublicKey)
	_, err = updateNode(ctx, kv, nil, id, func(n *clusterpb.Node) ([]clientv3.Op, error) {
		if n == nil {
			return nil, status.Errorf(codes.NotFound, "no node registered with this key (node %s)", id)
		}
		switch n.State {
		case clusterpb.NodeState_NODE_STATE_NEW:
			n.State = clusterpb.NodeState_NODE_STATE_STANDBY
			return nil, nil
		case clusterpb.NodeState_NODE_STATE_STANDBY, clusterpb.NodeState_NODE_STATE_UP:
			// Refused rather than ignored: the owner's tool should show that
			// this approval did nothing (e.g. a typo naming another node).
			return nil, status.Errorf(codes.FailedPrecondition, "node %s is already approved (state %s)", id, n.State)
		case clusterpb.NodeState_NODE_STATE_DECOMMISSIONED:
			return nil, status.Errorf(codes.FailedPrecondition, "node %s is decommissioned and cannot be approved", id)
		}
		return nil, status.Errorf(codes.FailedPrecondition, "node %s is in state %s", id, n.State)
	})
	if err != nil {
		return nil, err
	}
	return &clusterpb.ApproveNodeResponse{}, nil
}

func (m managementServer) DecommissionNode(ctx context.Context, req *clusterpb.DecommissionNodeRequest) (*clusterpb.DecommissionNodeResponse, error) {
	const method = "DecommissionNode"
	kv, st, err := m.backend()
	if err != nil {
		return nil, err
	}
	n, _, err := getNode(ctx, kv, req.Id)
	if err != nil {
		return nil, etcdErr(method, err)
	}
	if n == nil {
		return nil, status.Errorf(codes.NotFound, "no node %q", req.Id)
	}
	if n.State == clusterpb.NodeState_NODE_STATE_DECOMMISSIONED {
		// Done before, but the revocation below may not have been.
		if err := revoke(ctx, kv, n.Id); err != nil {
			return nil, err
		}
		return &clusterpb.DecommissionNodeResponse{}, nil
	}
	// etcd's member list decides, not the record: a concurrent role
	// change may have added the member the record does not show yet.
	if n.GetRoles().GetConsensusMember() != nil || isEtcdMember(ctx, st, n.Id) {
		if err := m.removeConsensusMember(ctx, kv, st, n.Id); err != nil {
			return nil, err
		}
	}
	_, err = updateNode(ctx, kv, nil, req.Id, func(n *clusterpb.Node) ([]clientv3.Op, error) {
		if n.State == clusterpb.NodeState_NODE_STATE_DECOMMISSIONED {
			return nil, errNoChange
		}
		n.State = clusterpb.NodeState_NODE_STATE_DECOMMISSIONED
		n.Roles = &clusterpb.NodeRoles{}
		n.ConsensusMemberPending = false
		// The join key index stays, so that JoinNode can say why it
		// refuses; the unlock key goes, which locks the node out of its
		// own disk.
		return []clientv3.Op{clientv3.OpDelete(unlockKeyKey(n.Id)), clientv3.OpDelete(heartbeatKey(n.Id))}, nil
	})
	if err != nil {
		return nil, err
	}
	// An AddNode that raced with this call finds the record
	// DECOMMISSIONED and rolls itself back; this catches the other order.
	if isEtcdMember(ctx, st, req.Id) {
		if err := st.RemoveNode(ctx, req.Id); err != nil {
			return nil, status.Errorf(codes.Unavailable, "node %s is decommissioned but still an etcd member (retry DecommissionNode): %v", req.Id, err)
		}
	}
	// Every certificate the node ever got goes on the CRL, which every
	// node checks in every handshake: the node is nobody from now on,
	// also to the nodes that never ask the curator about it.
	if err := revoke(ctx, kv, req.Id); err != nil {
		return nil, status.Errorf(status.Code(err), "node %s is decommissioned but its certificates are not revoked yet (retry DecommissionNode): %v", req.Id, status.Convert(err).Message())
	}
	return &clusterpb.DecommissionNodeResponse{}, nil
}

// isEtcdMember reports whether etcd lists the node as a member (false if
// etcd cannot say).
func isEtcdMember(ctx context.Context, st *consensus.Status, id string) bool {
	if st == nil || st.ClusterClient() == nil {
		return false
	}
	ml, err := st.ClusterClient().MemberList(ctx)
	if err != nil {
		return false
	}
	for _, mem := range ml.Members {
		if consensus.GetEtcdMemberNodeId(mem) == id {
			return true
		}
	}
	return false
}

// removeConsensusMember removes a node's etcd member, refusing to remove
// the last one.
func (s *Service) removeConsensusMember(ctx context.Context, kv clientv3.KV, st *consensus.Status, id string) error {
	nodes, _, err := listNodes(ctx, kv)
	if err != nil {
		return err
	}
	others := 0
	for _, n := range nodes {
		if n.Id != id && n.State == clusterpb.NodeState_NODE_STATE_UP && n.GetRoles().GetConsensusMember() != nil {
			others++
		}
	}
	if others == 0 {
		return status.Errorf(codes.FailedPrecondition, "node %s is the last consensus member: removing it would destroy the cluster", id)
	}
	if err := st.RemoveNode(ctx, id); err != nil {
		return status.Errorf(codes.FailedPrecondition, "removing the consensus member of %s: %v", id, err)
	}
	// A former member runs no curator: nobody may accept it as one.
	if err := revoke(ctx, kv, id, certCurator); err != nil {
		return status.Errorf(status.Code(err), "the consensus member of %s is removed but its curator certificates are not revoked yet (retry): %v", id, status.Convert(err).Message())
	}
	return nil
}

// UpdateNodeRoles gives or takes a node's roles in three steps: decide
// what the node has and what the call wants (planRoles), change etcd's
// membership (changeMembership), record the roles (recordRoles).
// Membership changes first: AddNode is idempotent, so a failure to record
// the role is repaired by calling again.
func (m managementServer) UpdateNodeRoles(ctx context.Context, req *clusterpb.UpdateNodeRolesRequest) (*clusterpb.UpdateNodeRolesResponse, error) {
	const method = "UpdateNodeRoles"
	id, err := rolesNodeID(req)
	if err != nil {
		return nil, err
	}
	kv, st, err := m.backend()
	if err != nil {
		return nil, err
	}
	n, _, err := getNode(ctx, kv, id)
	if err != nil {
		return nil, etcdErr(method, err)
	}
	if n == nil {
		return nil, status.Errorf(codes.NotFound, "no node %q", id)
	}
	if n.State != clusterpb.NodeState_NODE_STATE_UP {
		return nil, status.Errorf(codes.FailedPrecondition, "node %s is %s: roles can only be given to UP nodes", id, n.State)
	}
	c, err := planRoles(id, n, req)
	if err != nil {
		return nil, err
	}
	if err := m.changeMembership(ctx, kv, st, n, c); err != nil {
		return nil, err
	}
	if err := recordRoles(ctx, kv, st, c); err != nil {
		return nil, err
	}
	if c.pending {
		m.wakeMembers()
	}
	return &clusterpb.UpdateNodeRolesResponse{}, nil
}

// rolesNodeID is the node an UpdateNodeRoles request names, by ID or by
// public key.
func rolesNodeID(req *clusterpb.UpdateNodeRolesRequest) (string, error) {
	var id string
	switch n := req.Node.(type) {
	case *clusterpb.UpdateNodeRolesRequest_Id:
		id = n.Id
	case *clusterpb.UpdateNodeRolesRequest_PublicKey:
		if len(n.PublicKey) != ed25519.PublicKeySize {
			return "", status.Errorf(codes.InvalidArgument, "public_key has %d bytes, want %d", len(n.PublicKey), ed25519.PublicKeySize)
		}
		id = identity.NodeID(n.PublicKey)
	}
	if id == "" {
		return "", status.Error(codes.InvalidArgument, "no node given (id or public_key)")
	}
	return id, nil
}

// roleChange is one UpdateNodeRoles call as it goes: planRoles fills in
// what the node had and what the call wants, changeMembership what it did
// to etcd, and apply writes the outcome into the record.
type roleChange struct {
	id  string
	req *clusterpb.UpdateNodeRolesRequest
	// was: the record named a consensus member; wasPending: the record
	// waited for the leader to add one (members.go).
	was, wasPending bool
	// consensusOn is whether the node is to be a consensus member.
	consensusOn bool
	// member is the role of the etcd member this call added (nil: none).
	member *clusterpb.NodeRoles_ConsensusMember
	// pending: the leader adds the member later.
	pending bool
}

// planRoles decides the consensus role the node is to have: the request's
// where it says, else the one the record has (or waits for). A Kubernetes
// controller needs the consensus role.
func planRoles(id string, n *clusterpb.Node, req *clusterpb.UpdateNodeRolesRequest) (*roleChange, error) {
	c := &roleChange{
		id:         id,
		req:        req,
		was:        n.GetRoles().GetConsensusMember() != nil,
		wasPending: n.GetConsensusMemberPending(),
	}
	c.consensusOn = c.was || c.wasPending
	if req.ConsensusMember != nil {
		c.consensusOn = *req.ConsensusMember
	}
	controllerOn := n.GetRoles().GetKubernetesController() != nil
	if req.KubernetesController != nil {
		controllerOn = *req.KubernetesController
	}
	if controllerOn && !c.consensusOn {
		return nil, status.Errorf(codes.FailedPrecondition,
			"the KubernetesController role needs the ConsensusMember role (the API server uses the local etcd member) on node %s", id)
	}
	c.pending = c.wasPending && c.consensusOn
	return c, nil
}

// changeMembership adds or removes the node's etcd member as c wants.
// While another learner catches up, etcd refuses a second one: the node is
// then recorded as pending and the leader adds it later (members.go).
func (m managementServer) changeMembership(ctx context.Context, kv client.Namespaced, st *consensus.Status, n *clusterpb.Node, c *roleChange) error {
	switch {
	case c.consensusOn && !c.was && !c.wasPending:
		busy, err := learnerInProgress(ctx, kv, st, c.id)
		if err != nil {
			return err
		}
		if !busy {
			c.member, err = m.addConsensusMember(ctx, st, n)
		}
		switch {
		case busy, errors.Is(err, consensus.ErrLearnerInProgress), errors.Is(err, consensus.ErrNotYetSafe):
			c.pending = true
		case err != nil:
			return addNodeErr(c.id, err)
		}
	case !c.consensusOn && c.was:
		return m.removeConsensusMember(ctx, kv, st, c.id)
	case !c.consensusOn && c.wasPending && isEtcdMember(ctx, st, c.id):
		// The leader was adding it just now: take the member back.
		return m.removeConsensusMember(ctx, kv, st, c.id)
	}
	return nil
}

// recordRoles writes c into the node's record. If that fails after this
// call added an etcd member, the member exists but no record names it: it
// is removed again, or the dangling learner would block every later
// AddNode.
func recordRoles(ctx context.Context, kv clientv3.KV, st *consensus.Status, c *roleChange) error {
	_, err := updateNode(ctx, kv, nil, c.id, c.apply)
	if err == nil || c.member == nil {
		return err
	}
	if rerr := st.RemoveNode(ctx, c.id); rerr != nil {
		return status.Errorf(codes.Unavailable, "%v; and removing the etcd member again failed: %v", err, rerr)
	}
	return err
}

// apply changes the record n as c decided. updateNode calls it with the
// record as it is now, which may have changed since planRoles read it.
func (c *roleChange) apply(n *clusterpb.Node) ([]clientv3.Op, error) {
	if n.State != clusterpb.NodeState_NODE_STATE_UP {
		return nil, status.Errorf(codes.FailedPrecondition, "node %s is %s: roles can only be given to UP nodes", c.id, n.State)
	}
	if n.Roles == nil {
		n.Roles = &clusterpb.NodeRoles{}
	}
	switch {
	case c.member != nil:
		n.Roles.ConsensusMember = c.member
		n.ConsensusMemberPending = false
	case c.pending:
		// Unless the leader added it meanwhile.
		n.ConsensusMemberPending = n.Roles.ConsensusMember == nil
	case !c.consensusOn:
		if n.Roles.ConsensusMember != nil && !c.was {
			return nil, status.Errorf(codes.Aborted, "node %s became a consensus member while this call ran: call again to remove the role", c.id)
		}
		n.Roles.ConsensusMember = nil
		n.ConsensusMemberPending = false
	}
	if c.req.KubernetesController != nil {
		n.Roles.KubernetesController = nil
		if *c.req.KubernetesController {
			n.Roles.KubernetesController = &clusterpb.NodeRoles_KubernetesController{}
		}
	}
	if c.req.KubernetesWorker != nil {
		n.Roles.KubernetesWorker = nil
		if *c.req.KubernetesWorker {
			n.Roles.KubernetesWorker = &clusterpb.NodeRoles_KubernetesWorker{}
		}
	}
	return nil, nil
}

// addConsensusMember adds the node to etcd as a learner and returns what
// it needs to join. AddNode's errors are returned wrapped (errors.Is
// finds consensus.ErrLearnerInProgress and ErrNotYetSafe); see addNodeErr.
func (s *Service) addConsensusMember(ctx context.Context, st *consensus.Status, n *clusterpb.Node) (*clusterpb.NodeRoles_ConsensusMember, error) {
	var opts []*consensus.AddNodeOption
	if s.cfg.AddNodeOptions != nil {
		opts = s.cfg.AddNodeOptions(n.Id)
	}
	jc, err := st.AddNode(ctx, n.Id, n.PublicKey, opts...)
	if err != nil {
		return nil, fmt.Errorf("adding %s to consensus: %w", n.Id, err)
	}
	self, err := memberPeerURL(ctx, st, n.Id, jc)
	if err != nil {
		return nil, err
	}
	return consensusMemberRole(jc, n.Id, self), nil
}

// withMembership fills in each node's etcd membership from the member
// list; if etcd cannot say, the field stays unspecified rather than
// failing the listing.
func withMembership(ctx context.Context, st *consensus.Status, nodes []*clusterpb.Node) {
	if st == nil || st.ClusterClient() == nil {
		return
	}
	ml, err := st.ClusterClient().MemberList(ctx)
	if err != nil {
		return
	}
	learner := map[string]bool{}
	for _, m := range ml.Members {
		learner[consensus.GetEtcdMemberNodeId(m)] = m.IsLearner
	}
	for _, n := range nodes {
		switch l, ok := learner[n.Id]; {
		case !ok:
			n.ConsensusMembership = clusterpb.ConsensusMembership_CONSENSUS_MEMBERSHIP_NONE
		case l:
			n.ConsensusMembership = clusterpb.ConsensusMembership_CONSENSUS_MEMBERSHIP_LEARNER
		default:
			n.ConsensusMembership = clusterpb.ConsensusMembership_CONSENSUS_MEMBERSHIP_VOTER
		}
	}
}

// memberPeerURL finds the peer URL AddNode gave the new member: the member
// named after the node (by name or by its default peer URL), or else the
// one member that AddNode did not list as existing.
func memberPeerURL(ctx context.Context, st *consensus.Status, id string, jc *consensus.JoinCluster) (string, error) {
	ml, err := st.ClusterClient().MemberList(ctx)
	if err != nil {
		return "", status.Errorf(codes.Unavailable, "listing consensus members: %v", err)
	}
	existing := map[string]bool{}
	for _, e := range jc.ExistingNodes {
		existing[e.URL] = true
	}
	var unknown []string
	for _, m := range ml.Members {
		if len(m.PeerURLs) == 0 {
			continue
		}
		if consensus.GetEtcdMemberNodeId(m) == id {
			return m.PeerURLs[0], nil
		}
		if !existing[m.PeerURLs[0]] {
			unknown = append(unknown, m.PeerURLs[0])
		}
	}
	if len(unknown) == 1 {
		return unknown[0], nil
	}
	return "", status.Errorf(codes.Unavailable, "cannot tell the peer URL of new member %s among %v (membership changed meanwhile?); retry", id, unknown)
}

// consensusMemberRole is a JoinCluster as stored in NodeRoles. peers
// include the new member itself, as the proto asks.
func consensusMemberRole(jc *consensus.JoinCluster, id, selfURL string) *clusterpb.NodeRoles_ConsensusMember {
	r := &clusterpb.NodeRoles_ConsensusMember{
		CaCertificate:   jc.CACertificate.Raw,
		NodeCertificate: jc.NodeCertificate.Raw,
	}
	if jc.InitialCRL != nil {
		r.InitialCrl = jc.InitialCRL.Raw
	}
	for _, e := range jc.ExistingNodes {
		r.Peers = append(r.Peers, &clusterpb.NodeRoles_ConsensusMember_Peer{Name: e.Name, Url: e.URL})
	}
	r.Peers = append(r.Peers, &clusterpb.NodeRoles_ConsensusMember_Peer{Name: id, Url: selfURL})
	return r
}

// JoinClusterFromRole turns the ConsensusMember role the curator stored
// back into what consensus.Config.JoinCluster needs. It returns nil, nil
// for a role without join data (the bootstrap node's).
func JoinClusterFromRole(r *clusterpb.NodeRoles_ConsensusMember) (*consensus.JoinCluster, error) {
	if r == nil || len(r.NodeCertificate) == 0 {
		return nil, nil
	}
	ca, err := parseCert(r.CaCertificate)
	if err != nil {
		return nil, fmt.Errorf("curator: consensus CA certificate: %w", err)
	}
	cert, err := parseCert(r.NodeCertificate)
	if err != nil {
		return nil, fmt.Errorf("curator: consensus node certificate: %w", err)
	}
	jc := &consensus.JoinCluster{CACertificate: ca, NodeCertificate: cert}
	if len(r.InitialCrl) > 0 {
		if jc.InitialCRL, err = parseCRL(r.InitialCrl, ca); err != nil {
			return nil, fmt.Errorf("curator: consensus CRL: %w", err)
		}
	}
	for _, p := range r.Peers {
		jc.ExistingNodes = append(jc.ExistingNodes, consensus.ExistingNode{Name: p.Name, URL: p.Url})
	}
	return jc, nil
}
