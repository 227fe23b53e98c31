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
//	   on stream error: next endpoint     every ClientConn built by Dial is
//	                                      pointed at the leader (UpdateState)
package rpc
