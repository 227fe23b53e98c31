// Package roleserver is the Role Server: it runs on every node and starts
// what the node's cluster roles call for (consensus and curator,
// Kubernetes), keeps the node's record at the curator up to date and
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
//	        ├── statuspush  addresses, version, boot count/time, problems,
//	        │               slot and updates (Config.Updates)
//	        ├── heartbeat   every curator.HeartbeatInterval; an answer is
//	        │               due within two intervals, else reconnect
//	        ├── hosts       node ID → address into Config.Names (+ cache)
//	        ├── policyfetch the cluster policy: registries, release keys
//	        └── kubernetes  controller and worker by the Kubernetes roles
//	   nodemgmt: NodeManagement on :7836 (Logs, Status, Reboot, PowerOff,
//	             Update: streamed into Config.Updates, platform/update)
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
//
// # Workers
//
// Each runnable that Service.Run starts is a worker: a type in its own
// file (worker_<runnable>.go) whose fields are its named inputs and
// outputs, and whose run method is the runnable. Run builds them from the
// Service's values, then runs the curator connection (workerCurator)
// itself: it lives as long as the Role Server. State that several
// workers share is a small type with its own lock, handed to each as a
// field: problems (the node's ongoing problems, in its status),
// resolverEndpoints (the resolver's curator endpoints), rolesFile
// (/data/node/roles and its retried writes), hostsFile (Config.Names and
// its cache) and clusterKeyRequests (the ClusterKey requests, clusterkey.go).
// The supervisor's runnables (in the node's status, crash loops as
// problems) come through each worker's own context
// (supervisor.Snapshot). The values between the workers:
//
//	runnable      type                inputs                           outputs
//	controlplane  workerControlPlane  node, Credentials, Roles,        ControlPlane (children consensus,
//	                                  addresses, status                curator), hostsFile, ClusterKey
//	                                                                   (keep, answered before etcd);
//	                                                                   bootstrap: Credentials, Roles, rolesFile
//	nodemgmt      workerNodeMgmt      Credentials, LogTree, status,    NodeManagement API, Power
//	                                  runnables, CuratorConnection
//	                                  (Update: the release keys)
//	rolefetch     workerRoleFetch     node, CuratorConnection          Roles, rolesFile (→ problems),
//	                                                                   ClusterKey (drop)
//	statuspush    workerStatusPush    node, CuratorConnection,         the node's status at the curator
//	                                  addresses, status (← problems)
//	heartbeat     workerHeartbeat     CuratorConnection                heartbeats, Resolver.Recheck,
//	                                                                   cluster CRL (acceptCRL)
//	hosts         workerHosts         node, CuratorConnection          hostsFile, resolverEndpoints,
//	                                                                   Directory, kubernetesControllers
//	kubernetes    workerKubernetes    node, Roles, ControlPlane,       children controller and worker,
//	                                  CuratorConnection, address,      KubernetesStatus
//	                                  kubernetesControllers
//	(Run itself)  workerCurator       node, Credentials, ControlPlane  CuratorConnection, resolverEndpoints
//
// # Enrolment
//
// Enrolment (roleserver/enrolment) is built with the Role Server; the
// Role Server never calls it. Enrolment calls Provide*Data, and watches
// two values the Role Server publishes for it (answering a ClusterKey
// request on the request itself):
//
//	Directory   the curators as the cluster lists them (hosts)  → sealed into the join state
//	ClusterKey  keep (controlplane, a member, before etcd) or   → the cluster unlock key sealed
//	            drop (rolefetch, the curator's roles)             locally or removed; Done(err)
package roleserver
