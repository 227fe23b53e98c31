// Package clusterpb holds the Go code generated from api/cluster/v1/*.proto:
// the cluster services (Curator for nodes, Management and AAA for the owner,
// NodeManagement on every node), the records they exchange (Node, NodeRoles,
// NodeStatus, ClusterDirectory, ClusterConfiguration), and the
// required_permission method option that declares what every RPC needs.
//
// Do not edit the .pb.go files; change the .proto and run `make generate`.
package clusterpb
