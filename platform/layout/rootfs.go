package layout

import (
	"path"
	"slices"
)

// The root filesystem of a running node: the read-only system image with
// writable filesystems mounted on its mount points and a few links into
// them. The builder writes the links and mount points into the system
// image, /init and the Kubernetes worker mount there, and the Kubernetes
// controller derives from the same values the host paths that no pod may
// mount (they hold node state or secrets): one list, so a new link or
// mount cannot be forgotten by the policy.
//
//	/dev /proc /sys /run   MovedMounts: the kernel's filesystems and the
//	                       runtime tmpfs, moved from the initramfs
//	/tmp                   TmpMount
//	/data /ephemeral       DataMount, EphemeralMount: the data volume and
//	                       the ephemeral tmpfs (roleserver/localstorage's
//	                       tree, placed at /)
//	/data/volumes          HostVolumesDir: the owner's, for pods' volumes
//	/var/lib/kubelet       KubeletDir: the kubelet's directory on /data
//	/var/lib/cni           CNICacheDir: containerd's CNI cache on /ephemeral
//	/etc/resolv.conf …     SystemLinks: files written at run time, in /run
//	/etc/hosts             HostsFile: the image's, localhost only
//	/var/run /var/log      SystemLinks: directories elsewhere

// Link is a symbolic link of the system image.
type Link struct {
	Path   string // absolute, on the node
	Target string // absolute: where it points
}

// SystemLinks are the system image's symbolic links.
var SystemLinks = []Link{
	// Written by the network service at run time.
	{"/etc/resolv.conf", "/run/resolv.conf"},
	// Written by the Kubernetes worker (the kubelet wants one).
	{"/etc/machine-id", "/run/machine-id"},
	{"/etc/hostname", "/run/hostname"},
	{"/etc/mtab", "/proc/self/mounts"},
	{"/var/run", "/run"},
	{"/var/log", "/ephemeral/log"},
}

// HostsFile is a file of the system image, read-only, holding
// HostsFileContent (localhost) and nothing the node relies on: node IDs
// resolve from the Role Server's map in memory (platform/nodenames), so
// no pod that names /etc/hosts as a host path can change how the node
// resolves anything. The upstream conformance suite mounts it into a pod,
// writable, and reads it; a write fails (the image is read-only). It is
// no protected host path; its neighbours that change at run time are
// links into /run (SystemLinks) and stay protected. Guarded by
// TestResolver, TestHostPathsPolicy and TestKubernetesTwoNodes
// (attackEtcHosts).
const HostsFile = "/etc/hosts"

// HostsFileContent is HostsFile's content.
const HostsFileContent = "127.0.0.1\tlocalhost\n::1\tlocalhost\n"

// MovedMounts are the filesystems /init mounts in the initramfs and moves
// into the system image when it switches root.
var MovedMounts = []string{"/dev", "/proc", "/sys", "/run"}

// TmpMount is the tmpfs /init mounts on /tmp, with TmpMountOptions,
// nosuid, nodev and nosymfollow. The node keeps nothing of its own
// there, so pods may name it as a host path (the upstream conformance
// Jobs keep a marker in /tmp/job-e2e). Why nosymfollow: /tmp is the one
// directory outside the node's state that any such pod can write, and a
// link planted there (/tmp/x -> /data) would otherwise lead another
// pod's host path /tmp/x into node state. With it the kernel follows no
// link on /tmp: containerd's stat of the host path fails (ELOOP) and the
// other pod's container is not made. (containerd resolves a host path's
// links itself after that stat: a link swapped in between would still
// be followed. Both pods need a namespace whose Pod Security level
// allows host paths, where pods can be node root anyway.) Guarded by
// TestKubernetesTwoNodes (attackTmpLink).
const TmpMount = "/tmp"

// TmpMountOptions bound /tmp: a tenth of the memory, 65536 inodes.
const TmpMountOptions = "mode=1777,size=10%,nr_inodes=65536"

// ESPMount is where /init mounts the boot disk's ESP (read-only, while it
// reads the parameters and the update state).
const ESPMount = "/run/plinth/esp"

// KubeletDir is where the kubelet's state appears: some of it (device
// plugins, pod resources) has fixed paths below /var/lib/kubelet whatever
// --root-dir says, so the worker mounts the data volume's directory here
// (a mount point in the read-only system image).
const KubeletDir = "/var/lib/kubelet"

// CNICacheDir is where containerd's CNI library keeps results, a fixed
// path; the worker mounts a directory of its tmpfs here.
const CNICacheDir = "/var/lib/cni"

// DataMount and EphemeralMount are where /init mounts the data volume and
// the ephemeral tmpfs: the roots of roleserver/localstorage's tree placed
// at / (its struct tags name them; roleserver/kubernetes's tests hold
// the two to these).
const (
	DataMount      = "/data"
	EphemeralMount = "/ephemeral"
)

// HostVolumesDir is the directory of the data volume that the node never
// uses itself: the one place below a protected host path that the
// cluster owner may open to pods (the cluster policy's allowed host
// paths: local PersistentVolumes, a volume provisioner's directory).
// Everything else below DataMount is the node's (etcd, credentials, the
// kubelet's pods' Secrets).
const HostVolumesDir = DataMount + "/volumes"

// LocalVolumesDir holds the node's local PersistentVolumes, made by its
// provisioner (`kube local-volumes`): a directory per volume, named as
// its PersistentVolume, each a filesystem of its own mounted there
// (platform/volumefs). It is
// node state like the rest of DataMount: no pod may use it as a host
// path, and only the node's own provisioner may create a local volume in
// it (the API server's local volume policy).
const LocalVolumesDir = DataMount + "/kubernetes/local-volumes"

// LocalVolumesProvisioner is the provisioner name of the node's local
// volumes (the default StorageClass "local" names it; their
// PersistentVolumes carry it in pv.kubernetes.io/provisioned-by).
const LocalVolumesProvisioner = "plinth.dev/local-volumes"

// ProtectedHostPaths are the host paths that hold or reach node state
// or secrets, clean and sorted: the data volume and the ephemeral tmpfs
// (etcd, the node's credentials, the confined etcd endpoint, the logs),
// the kernel's filesystems and /run (the devices, the decrypted data
// volume and the TPM among them; every process's root; the cgroups the
// confined endpoint trusts; the ESP below /run), the worker's mounts on
// fixed paths (the kubelet's directory holds pods' Secrets) and the
// system image's links with their targets. Not /tmp: the pods' own,
// whose links are never followed (TmpMount); nor /etc/hosts, read-only
// and trusted by nothing (HostsFile). / and every directory above one of
// them contain them. No pod or PersistentVolume may use any of them, and
// the cluster policy may open none of them but HostVolumesDir: the
// Kubernetes controller's host path policy and the policy's check
// (clusterpb.KubernetesPolicy.Check) both derive from this one list.
func ProtectedHostPaths() []string {
	ps := []string{DataMount, EphemeralMount, KubeletDir, CNICacheDir, ESPMount}
	ps = append(ps, MovedMounts...)
	for _, l := range SystemLinks {
		ps = append(ps, l.Path, l.Target)
	}
	for i, p := range ps {
		ps[i] = path.Clean(p)
	}
	slices.Sort(ps)
	return slices.Compact(ps)
}
