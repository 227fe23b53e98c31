// Package rpc is the gRPC layer shared by every cluster service: who may
// call what (the authorizer), a server constructor wiring it in, and the
// client-side resolver that keeps a connection pointed at the curator
// leader while the cluster changes underneath it.
//
// Server side:
//
//	client ──TLS (any client cert)──► grpc.Server (NewServer)
//	                                    │ Authorizer.Unary / .Stream
//	                                    │  1. identity.PeerFromContext → Kind
//	                                    │     (none/invalid → UNAUTHENTICATED)
//	                                    │  2. RequiredPermission(method), read
//	                                    │     from the .proto method option
//	                                    │  3. Permitted(kind, permission)
//	                                    │     (no → PERMISSION_DENIED)
//	                                    ▼
//	                                  handler: PeerFrom(ctx) → *identity.Peer
//
// Client side (Resolver, target "plinth-curator:///leader"):
//
//	endpoints (directory, local curator) ──► GetCurrentLeader stream on one
//	         ▲ AddEndpoint / SetEndpoints        │ each response: leader host:port
//	         │                                   ▼
//	   next endpoint when the stream:     every ClientConn built by Dial is
//	    - fails (keepalive: a vanished    pointed at the leader (UpdateState)
//	      peer within seconds)                   │
//	    - gives no answer in 10 s                │ calls fail UNAVAILABLE /
//	    - runs to the leader and Recheck ◄───────┘ NOT_LEADER, the connection
//	      is called                                 is lost (ResolveNow), or
//	                                                the heartbeat goes
//	                                                unanswered (Recheck)
//
// Keepalives (keepalive.go) are the one place where the cluster's gRPC
// servers and clients agree on how fast a dead peer is noticed: without
// them a connection to a node that lost power lives until TCP gives up
// (~15 minutes), or forever if nothing is sent on it (a watch, the
// GetCurrentLeader stream itself), and every stream on it waits for a
// leader that is gone.
package rpc
