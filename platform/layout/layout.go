// Package layout holds the few constants that the image builder, /init,
// the Role Server and the operator tools must agree on: where things are
// in the initramfs, and the fixed ports of a node's cluster services.
//
// It is deliberately tiny and imports nothing, so that /init can share
// these values with the builder without linking the builder.
//
//	initramfs                          node (every node, same ports)
//	  /system.img    SystemImagePath     :7834  ConsensusPeerPort   etcd peers (mTLS)
//	  /etc/plinth/   ModuleLoadList      :7835  CuratorPort         Curator, Management, AAA
//	   modules.load                      :7836  NodeManagementPort  logs, status, power
package layout

// Paths inside the initramfs, relative to its root.
const (
	// SystemImagePath is the verity-protected system image: the first,
	// uncompressed entry of the initramfs.
	SystemImagePath = "system.img"
	// ModuleLoadList lists the early kernel modules in load order, one
	// path (relative to /lib/modules/VERSION) per line.
	ModuleLoadList = "etc/plinth/modules.load"
)

// Fixed ports of the cluster services. Every node uses the same ones, so
// a directory entry needs only addresses.
const (
	ConsensusPeerPort  = 7834
	CuratorPort        = 7835
	NodeManagementPort = 7836
)
