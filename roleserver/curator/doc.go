// Package curator keeps the cluster's state (nodes, roles, keys, policy)
// in etcd and serves it to nodes (Curator), to the owner (Management) and
// for the ownership hand-over (AAA). A curator runs next to every
// consensus member; one of them is the leader.
//
//	             ┌─────────────── curator on every consensus member ───────────────┐
//	node ──mTLS──► Curator     RegisterNode CommitNode JoinNode Watch              │
//	             │             UpdateNodeStatus Heartbeat IssueCertificate         │
//	             │               (leader only; followers: UNAVAILABLE "leader is X")│
//	             │             GetCurrentLeader (every member, streams changes)    │
//	owner ───────► Management  GetRegisterTicket GetClusterInfo GetNodes           │
//	             │             ApproveNode UpdateNodeRoles DecommissionNode        │
//	             │             IssueKubernetesCredentials (any member)             │
//	plinthctl ───► AAA         Escrow: owner key → owner certificate (any)         │
//	             └───────┬──────────────────────────────────────┬──────────────────┘
//	                     │ namespaced etcd client               │ AddNode/RemoveNode
//	                     ▼                                      ▼
//	   /cluster/{ca.pem,ca-key.pem,owner-key,ticket,configuration,crl}   consensus
//	   /nodes/<id>                clusterpb.Node (no health)
//	   /join-keys/<hex key>       node ID
//	   /cluster-unlock-keys/<id>  32 bytes
//	   /heartbeats/<id>           unix nanos, written by the leader
//	   /certs/<id>/{node,curator}/<serial>  every certificate issued (for revocation)
//	   /kubernetes-ca/…           Kubernetes CAs and service-account key
//	                              (roleserver/kubernetes/pki)
//	   /leader, /leader-since     leased: GetCurrentLeaderResponse{id, port}
//
// Leader election: each curator grants a lease (Config.LeaderTTL, 5 s)
// and creates /leader with it if it does not exist; the winner keeps the
// lease alive, the others watch /leader and try again when it is deleted.
// Every write of a leader-only RPC is a transaction conditioned on /leader
// still having the creation revision of this leader's term, so a leader
// that lost its lease without noticing yet cannot write. Followers refuse
// leader-only RPCs with UNAVAILABLE and reason NOT_LEADER, on which nodes
// re-learn the leader. The servers use the cluster's gRPC keepalives
// (rpc.ServerKeepalive), so nodes notice a leader that lost power within
// seconds.
//
// Consensus members are added one at a time (members.go): etcd admits
// one learner at a time, so UpdateNodeRoles records a node as
// consensus_member_pending while another learner catches up, and the
// leader adds pending members itself, one after the other:
//
//	UpdateNodeRoles ─► no learner: AddNode, role with join data now
//	               └─► learner in progress: pending ─► leader loop, once
//	                   the learner was promoted: AddNode, role, pending off
//
// Node lifecycle:
//
//	RegisterNode (ticket, TPM policy, bounded status, at most 32 NEW) → NEW
//	  → ApproveNode (owner) → STANDBY
//	  → CommitNode (join key proof; certificate + cluster unlock key) → UP
//	  → DecommissionNode → DECOMMISSIONED (key refused forever)
//	JoinNode (join key + session proof) → cluster unlock key, UP nodes only
//
// Health is derived by the leader from heartbeats: HEALTHY within
// HeartbeatTimeout of the last one, UNKNOWN while the leader is younger
// than the timeout and has not heard from the node, else
// HEARTBEAT_TIMEOUT. Heartbeats are written to etcd at most once per
// HeartbeatInterval per node so that every member computes the same;
// the leader itself computes health from the heartbeats it received in
// its term and reads none (watches check health every few seconds).
// Its member loop lists the nodes only when a node record changed (an
// etcd watch) or while a member is pending.
//
// Trust: a curator serves with a curator certificate it issues itself
// for its node key at start (recorded under /certs/), which is what
// clients of these services require, so a worker's node certificate can
// never pose as the curator. Decommissioning a node revokes every
// certificate recorded for it, removing the ConsensusMember role revokes
// its curator certificates; the cluster CRL (/cluster/crl) is followed by
// every curator and handed to nodes with heartbeat answers and
// GetClusterInfo.
//
// Kubernetes: IssueCertificate signs a worker's kubelet certificates from
// the Kubernetes PKI, the serving one for exactly the caller's node ID and
// the addresses on its record; IssueKubernetesCredentials gives the owner
// a one-hour kubectl client certificate (system:masters) and the API
// servers' addresses (UP KubernetesController nodes, port 6443).
//
// Authorization happens in one place, the interceptor of roleserver/rpc:
// each RPC's required_permission and the kinds of caller each permission
// is granted_to come from the .proto; the curator adds one CallerCheck
// (checkCaller: a node caller must be UP, on record for exactly its key,
// and not decommissioned). Handlers take the caller from rpc.PeerFrom and
// only check what depends on data (the node named is the caller, the key
// is the owner's, the ticket is valid). Refusals a client must act on
// carry an ErrorReason (rpc.Error / rpc.Reason).
package curator
