// Package roleserver is the Role Server: it runs on every node and starts
// what the node's cluster roles call for (consensus and curator now,
// Kubernetes later), keeps the node's record at the curator up to date and
// serves the node's own management API.
//
//	enrolment ──Provide{Bootstrap,Register,Join}Data──► node data, credentials
//	                                                       │
//	 /data/node/roles ──► Roles ◄── rolefetch (Curator.Watch own node)
//	                        │
//	                        ▼
//	                   controlplane ──► consensus (etcd) + curator
//	                        │             └── bootstrap: curator.Bootstrap,
//	                        │                 credentials saved to /data/node
//	                        ▼
//	  Resolver (follows curator leader) ◄── directory, local curator,
//	        │      ▲                         consensus members (hosts)
//	        │      └── Recheck: heartbeat unanswered, calls UNAVAILABLE /
//	        │          NOT_LEADER, leader connection lost
//	        ├── rolefetch   roles (+ health) of this node
//	        ├── statuspush  addresses, version, boot count/time
//	        ├── heartbeat   every curator.HeartbeatInterval; an answer is
//	        │               due within two intervals, else reconnect
//	        └── hosts       node ID → address into HostsPath (+ cache)
//	   nodemgmt: NodeManagement on :7836 (Logs, Status, Reboot, PowerOff)
//
// Failover: when the curator leader loses power, nothing closes the
// node's connection to it. The heartbeat notices first (no answer), the
// gRPC keepalives of roleserver/rpc close the dead connection within
// seconds (every stream on it fails), and the resolver asks another
// curator who leads now; the workers' retries then land at the new
// leader. Without that, the streams stayed attached to the dead leader
// until TCP gave up, and the node was HEARTBEAT_TIMEOUT at the new one.
//
// State lives in event values (platform/event/memory): the input from
// enrolment, the node's credentials, its roles, the curator connection and
// the local control plane. Every worker is a supervised runnable that
// waits for the values it needs and reacts to their changes, so the
// bootstrap problem (a consensus member must run the control plane before
// it can ask the control plane for anything) resolves itself: the roles
// persisted on the data partition start the local etcd and curator, and the
// resolver then finds the curator leader among the known endpoints,
// including this node's own curator.
//
// A change of the consensus_member role restarts the controlplane runnable
// (it returns an error), which stops or starts etcd and the curator as a
// unit; the supervisor's restart is the only way to stop a child runnable.
package roleserver
