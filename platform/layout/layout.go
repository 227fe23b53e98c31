// Package layout holds the few constants that the image builder, /init,
// the Role Server and the operator tools must agree on: where things are
// in the initramfs, and the fixed ports of a node's cluster services.
//
// It is deliberately tiny and imports nothing but the standard library,
// so that /init can share these values with the builder without linking
// the builder.
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

// Kubernetes on a node: where the system image keeps its binaries and
// images, and the ports and address ranges every node agrees on.
const (
	// KubeBinary is the multi-call Kubernetes binary (cmd/kube).
	KubeBinary = "/usr/bin/kube"
	// ContainerdBinary, ContainerdShimBinary and OCIRuntimeBinary are
	// the container runtime: containerd, its runc-compatible shim, and
	// the OCI runtime the shim runs (crun, built by scripts/crun).
	ContainerdBinary     = "/usr/bin/containerd"
	ContainerdShimBinary = "/usr/bin/containerd-shim-runc-v2"
	OCIRuntimeBinary     = "/usr/bin/crun"
	// CNIBinDir holds the CNI plugins (ptp, host-local, loopback).
	CNIBinDir = "/usr/lib/cni"
	// NftBinary is nft, which kube-proxy's nftables mode runs.
	NftBinary = "/usr/sbin/nft"
	// ImagesDir holds the OCI image archives the builder made
	// (PauseImageArchive, TestImageArchive), imported into containerd's
	// k8s.io namespace at boot.
	ImagesDir         = "/usr/share/plinth/images"
	PauseImageArchive = "pause.tar"
	TestImageArchive  = "testpod.tar"
	// PauseImage and TestImage are the references the archives carry.
	PauseImage = "plinth.dev/pause:v1"
	TestImage  = "plinth.dev/testpod:v1"
	// KubernetesModuleLoadList lists, in load order, the kernel modules
	// the Kubernetes worker needs (overlay, veth, bridge, nf_tables and
	// kube-proxy's nftables expressions, ...), one path relative to
	// /lib/modules/VERSION per line, as ModuleLoadList does for the early
	// modules: kmod.LoadList(moduleDir, KubernetesModuleLoadList). Nothing
	// loads them at boot; a node without the worker role never does.
	// Modules already loaded at boot are not listed.
	KubernetesModuleLoadList = "/etc/plinth/kubernetes-modules.load"
)

// Kubernetes ports and address ranges.
const (
	// KubernetesAPIPort is where every controller's API server listens.
	KubernetesAPIPort = 6443
	// KubernetesAPIProxyPort is the local load balancer on 127.0.0.1 of
	// every worker, which forwards to the API servers the curator names.
	KubernetesAPIProxyPort = 6444
	// KubeletPort is the kubelet's API.
	KubeletPort = 10250
	// MetricsServerPort is where every controller's metrics server
	// (the metrics.k8s.io API the API servers aggregate) listens.
	MetricsServerPort = 10251
	// KubernetesAuthzWebhookPort is where every controller serves its
	// API server the decommissioned nodes' authorization webhook, on
	// 127.0.0.1 only.
	KubernetesAuthzWebhookPort = 10252
	// ClusterCIDR is the pod network; each node gets a /NodeCIDRMaskSize
	// of it from the controller manager.
	ClusterCIDR      = "10.244.0.0/16"
	NodeCIDRMaskSize = 24
	// ServiceCIDR is the Service network; its first address is the
	// kubernetes.default Service (KubernetesServiceIP).
	ServiceCIDR         = "10.96.0.0/16"
	KubernetesServiceIP = "10.96.0.1"
	// ClusterDNSIP is the link-local address every worker's own DNS
	// server answers on (a dummy interface), what pods get as nameserver.
	ClusterDNSIP = "169.254.53.53"
	// ClusterDomain is the cluster's DNS domain.
	ClusterDomain = "cluster.local"
)

// The flashable disk the builder writes (disk.img), and how a UKI names
// the system slot it boots:
//
//	GPT  1 ESP (FAT32)         EFI/BOOT/BOOTX64.EFI, EFI/plinth/{a,b}.efi, plinth/parameters.pb
//	     2 plinth-system-a     system image + dm-verity hash tree
//	     3 plinth-system-b     the other slot (empty until an update)
//	     4 data                created by the node on first boot in the free space
const (
	// ESPType is the UEFI system partition's GPT type.
	ESPType = "C12A7328-F81F-11D2-BA4B-00A0C93EC93B"
	// SystemSlotType is the GPT type of a system slot. It was generated
	// once at random and must never change: nodes find their slots by it.
	SystemSlotType = "35749AAB-D594-42B6-9B72-79768C762150"
	// SystemSlotNamePrefix + "a" or "b" is a slot's GPT partition name.
	SystemSlotNamePrefix = "plinth-system-"
	// SlotArg on the kernel command line (in the UKI, measured) names the
	// slot whose partition holds the system image: "a" or "b". Without
	// it the system image is the initramfs's SystemImagePath (network
	// boot, QEMU -kernel).
	SlotArg = "plinth.slot"
	// TimerSlackArg on the kernel command line is the timer slack (a Go
	// duration) of the core and of every process it starts: a board's
	// choice (the QEMU board's says why), the kernel's 50 µs without it.
	TimerSlackArg = "plinth.timer_slack"
	// ESPParameters is the node parameters file on the ESP.
	ESPParameters = "plinth/parameters.pb"
	// ESPBootFile is the firmware's default boot file on removable media
	// and the fallback on fixed disks; ESPSlotUKI(s) is slot s's UKI.
	ESPBootFile = "EFI/BOOT/BOOTX64.EFI"
)

// ESPSlotUKI is the path of slot s's UKI on the ESP.
func ESPSlotUKI(slot string) string { return "EFI/plinth/" + slot + ".efi" }

// Users the Kubernetes control plane runs as, each its own and
// unprivileged (the group of the same number): no component reads
// another's keys, and the confined etcd endpoint serves the API server's
// user alone. Pods run in containers of their own cgroups, so a container
// process with one of these numbers is still not taken for the component.
const (
	APIServerUser         = 10001
	ControllerManagerUser = 10002
	SchedulerUser         = 10003
	MetricsServerUser     = 10004
)
