// Package consensus runs this node's etcd member: the cluster's consensus
// store, embedded in the node's own process.
//
// Bootstrap (no etcd data, no JoinCluster): the cluster's CA key must live
// only inside etcd, but etcd cannot serve peer TLS before that CA exists.
// So the first member comes up twice:
//
//	 etcd #1 in bootstrap.tmp/data             etcd #2 in Data.Data
//	┌──────────────────────────────┐          ┌──────────────────────────────┐
//	│ peers: http, 127.0.0.1 only  │          │ peers: https, mutual TLS     │
//	│ create CA, own cert, CRL     │   stop   │ on the peer port; the CRL    │
//	│ (the CA key stays in etcd)   │ ───────► │ file is checked on every     │
//	│ MemberUpdate(real peer URL)  │          │ incoming peer connection     │
//	└──────────────────────────────┘          └──────────────────────────────┘
//	  then: write the Data.PeerPKI files, rename(2) the data into place
//
// Join (JoinCluster from AddNode on a running member):
//
//	member A (running)                         new member B
//	Status.AddNode(B, pubkey) ─── JoinCluster ──► write CA/cert/key/CRL files
//	  issue cert for B's key                     start etcd, state "existing",
//	  record cert + peer URL                     initial cluster = A.. + B
//	  MemberAddAsLearner(B)  ◄────── raft over mTLS, B catches up ──────┘
//	autopromoter (leader only): MemberPromote(B) once B is in sync;
//	only then does B report itself running (learners serve no clients)
//
// Restart (etcd WAL on disk): the data and peer PKI on disk decide which
// cluster this is; JoinCluster is ignored. The data directory is read (never
// written) first, so that a damaged one is a clear error of Run rather than
// a panic inside etcd; etcd data is never deleted.
//
// PKI and sockets:
//
//	etcd raw keyspace                       disk (Data.PeerPKI)
//	/consensus/pki/ca.pem, ca-key.pem       ca.pem  cert.pem  key.pem
//	/consensus/pki/crl.der ── watched by ──► crl.der (DER: etcd parses it per
//	/consensus/members/<id>/{cert,peer}        every member   connection)
//	/curator/...    ◄── CuratorClient()     ┐ namespaced (client/v3/namespace),
//	/kubernetes/... ◄── KubernetesClient()  ┘ neither sees the other's keys
//
//	clients ── in-process (backend: v3client and its adapters) ──────────► etcd
//	           no client port, no socket: embed's client listener is a unix
//	           socket Ephemeral.ClientSocket whose file is unlinked at once
//	kube-apiserver ── ServeKubernetes (own socket, one UID, /kubernetes/) ─► etcd
//	peers   ── TCP peer port, mutual TLS: ed25519 cluster CA + CRL ──────► etcd
//
// Peer addresses: a member advertises https://<node ID>:7834 and AddNode
// registers new members the same way, so the cluster's name resolution has
// to map node IDs to node addresses (Config.Tuning and PeerAddress override
// host and port, for several members on one host in tests). GetEtcdMemberNodeId relies on this for members that
// have not started yet.
//
// Every member certificate carries the fixed DNS name peerServerName, which
// is what a member checks when dialling a peer; the peer's address is not
// part of its identity. RemoveNode removes the member (etcd refuses removals
// that would cost quorum) and revokes its certificate; every member's CRL
// watcher rewrites its CRL file, so the removed node can no longer connect
// to anyone.
//
// etcd logs through a zap logger whose core writes into the runnable's
// logger, i.e. into the node's log tree.
package consensus
