package kubernetes

import (
	"fmt"
	"strings"

	"plinth.dev/plinth/platform/layout"
	"plinth.dev/plinth/roleserver/localstorage"
)

// containerdConfig is containerd's configuration (version 3, containerd
// 2.x) for a node's storage tree: images and snapshots on /data (pods'
// images survive a reboot), state and the socket on tmpfs, the CRI plugin
// on with crun through containerd's runc shim (cgroup v2, cgroupfs like
// the kubelet), CNI from the system image with the configuration netd
// writes, containerd's own loopback (no loopback plugin needed), and the
// sandbox image pinned so that image garbage collection never removes it
// (it cannot be pulled again: there is no registry), and the registries'
// hosts directory (registries.go).
//
// crun, not runc: the shim runs the OCI runtime eight times for a pod
// (create, start, kill and delete of its sandbox and its container), and
// each runc is a Go program's start (~0.2 s of CPU under TCG, plus ~0.5 s
// for its `runc init` in the new container); crun is C, its command line
// the same, and its init runs in the process it forks. The runtime keeps
// the name "runc" all the same: it is the CRI handler name that the
// sandboxes an updated node kept on /data record, and containerd's name
// for its runc-compatible shim; BinaryName is what picks crun.
//
// stats_collect_period: containerd 2.4 asks every container's and
// sandbox's shim for its CPU time each second (by default), for a CPU
// rate the kubelet does not read (it takes CPU from its own cAdvisor
// while the PodAndContainerStatsFromCRI gate is off, as it is by
// default); every 10 s, as often as cAdvisor looks, spares each pod a
// wakeup of its shim a second, costly under TCG.
func containerdConfig(root *localstorage.Root) []byte {
	var b strings.Builder
	q := func(s string) string { return fmt.Sprintf("%q", s) }
	fmt.Fprintf(&b, `version = 3
root = %s
state = %s

[grpc]
  address = %s

[plugins."io.containerd.cri.v1.images"]
  snapshotter = "overlayfs"
  [plugins."io.containerd.cri.v1.images".pinned_images]
    sandbox = %s
  [plugins."io.containerd.cri.v1.images".registry]
    config_path = %s

[plugins."io.containerd.cri.v1.runtime"]
  enable_selinux = false
  stats_collect_period = "10s"
  [plugins."io.containerd.cri.v1.runtime".cni]
    bin_dirs = [%s]
    conf_dir = %s
    max_conf_num = 1
    use_internal_loopback = true
  [plugins."io.containerd.cri.v1.runtime".containerd]
    default_runtime_name = "runc"
    [plugins."io.containerd.cri.v1.runtime".containerd.runtimes.runc]
      runtime_type = "io.containerd.runc.v2"
      [plugins."io.containerd.cri.v1.runtime".containerd.runtimes.runc.options]
        BinaryName = %s
        SystemdCgroup = false
`,
		q(root.Data.Containerd.Path()), q(root.Ephemeral.Containerd.Path()),
		q(root.Ephemeral.Containerd.Socket.Path()),
		q(layout.PauseImage), q(root.Ephemeral.Containerd.Hosts.Path()),
		q(layout.CNIBinDir), q(root.Ephemeral.Kubernetes.CNI.Path()),
		q(layout.OCIRuntimeBinary))
	return []byte(b.String())
}
