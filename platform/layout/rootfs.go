package layout

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
//	/data /ephemeral       the data volume and the ephemeral tmpfs
//	                       (roleserver/localstorage places them)
//	/var/lib/kubelet       KubeletDir: the kubelet's directory on /data
//	/var/lib/cni           CNICacheDir: containerd's CNI cache on /ephemeral
//	/etc/resolv.conf …     SystemLinks: files written at run time, in /run
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
	{"/etc/hosts", "/run/hosts"},
	{"/etc/hostname", "/run/hostname"},
	{"/etc/mtab", "/proc/self/mounts"},
	{"/var/run", "/run"},
	{"/var/log", "/ephemeral/log"},
}

// MovedMounts are the filesystems /init mounts in the initramfs and moves
// into the system image when it switches root.
var MovedMounts = []string{"/dev", "/proc", "/sys", "/run"}

// TmpMount is the tmpfs /init mounts on /tmp.
const TmpMount = "/tmp"

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
