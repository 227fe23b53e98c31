package kubernetes

import (
	"net"
	"strconv"

	"plinth.dev/plinth/platform/layout"
	"plinth.dev/plinth/roleserver/localstorage"
)

// kubeletParams is what a node's kubelet configuration depends on.
type kubeletParams struct {
	root *localstorage.Root
	// clientCA verifies clients of the kubelet's API (the API server).
	clientCA string
	// certFile and keyFile are the kubelet's serving certificate (from
	// the curator: SANs only the node's ID and its known addresses).
	certFile, keyFile string
	// resolvConf is the node's resolver configuration (pods with
	// dnsPolicy Default inherit it).
	resolvConf string
	// cpus is the node's CPU count and controlPlane whether it also runs
	// the control plane (a controller): then part of its CPU is kept from
	// pods (controlPlaneCPU).
	cpus         int
	controlPlane bool
}

// kubeletConfig is the KubeletConfiguration (kubelet.config.k8s.io/
// v1beta1) as JSON. Written by hand, not with the Kubernetes types: the
// Role Server runs in PID 1, which must not link the Kubernetes API.
//
// The choices that matter on Plinth: cgroup v2 through cgroupfs with pods
// under the root cgroup (the core sits in its own leaf); no static pods;
// every path the kubelet would write on the read-only system image moved
// to /data or tmpfs; only the API server (client CA + webhook) may use the
// kubelet's API; DNS is the node's own server on a link-local address;
// eviction thresholds low enough for small test disks.
func kubeletConfig(p kubeletParams) []byte {
	return mustJSON(map[string]any{
		"apiVersion":               "kubelet.config.k8s.io/v1beta1",
		"kind":                     "KubeletConfiguration",
		"address":                  "0.0.0.0",
		"port":                     layout.KubeletPort,
		"readOnlyPort":             0,
		"tlsCertFile":              p.certFile,
		"tlsPrivateKeyFile":        p.keyFile,
		"rotateCertificates":       false,
		"serverTLSBootstrap":       false,
		"containerRuntimeEndpoint": "unix://" + p.root.Ephemeral.Containerd.Socket.Path(),
		"cgroupDriver":             "cgroupfs",
		"cgroupRoot":               "/",
		"cgroupsPerQOS":            true,
		"failSwapOn":               false,
		"staticPodPath":            "",
		"podLogsDir":               p.root.Data.Kubernetes.PodLogs.Path(),
		"volumePluginDir":          p.root.Ephemeral.Kubernetes.VolumePlugins.Path(),
		"resolvConf":               p.resolvConf,
		"clusterDomain":            layout.ClusterDomain,
		"clusterDNS":               []string{layout.ClusterDNSIP},
		"authentication": map[string]any{
			"anonymous": map[string]any{"enabled": false},
			"webhook":   map[string]any{"enabled": true},
			"x509":      map[string]any{"clientCAFile": p.clientCA},
		},
		"authorization": map[string]any{"mode": "Webhook"},
		"kubeReserved":  kubeReserved(p),
		"evictionHard": map[string]string{
			"memory.available":  "64Mi",
			"nodefs.available":  "3%",
			"imagefs.available": "3%",
		},
		"imageGCHighThresholdPercent": 95,
		"imageGCLowThresholdPercent":  90,
		"enforceNodeAllocatable":      []string{"pods"},
		"serializeImagePulls":         false,
		// Containers without a seccomp profile of their own run under the
		// runtime's default one (RuntimeDefault), not unconfined.
		"seccompDefault": true,
		"logging":        map[string]any{"format": "text"},
	})
}

// kubeReserved is what the kubelet keeps from pods for the node's own
// Kubernetes programs: on a controller, controlPlaneCPU; on a worker,
// nothing (its kubelet, containerd and kube-proxy have a cgroup of
// their own above the pods', init's setupCgroups).
func kubeReserved(p kubeletParams) map[string]string {
	if !p.controlPlane {
		return map[string]string{}
	}
	return map[string]string{"cpu": strconv.Itoa(controlPlaneCPU(p.cpus)) + "m"}
}

// controlPlaneCPU is the CPU, in millicores, a controller keeps from its
// pods for the control plane beside them: half its CPUs, at most two.
// The kubelet weighs the pods' cgroup by what is left (init's
// setupCgroups), so that the pods on a busy controller yield CPU to the
// API server and etcd, and the scheduler counts requests against it.
// Under TCG, with 2 vCPUs, a controller's control plane used 0.9 of them
// while 50 pods started beside it; with this its API server's requests
// took a third less time. The scheduler still spreads pods half and half:
// its default topology spreading outweighs the free CPU.
func controlPlaneCPU(cpus int) int {
	return min(cpus*500, 2000)
}

// kubeletArgs are the kubelet's flags besides --config.
func kubeletArgs(configFile, kubeconfigFile, rootDir, nodeID string, nodeIP net.IP) []string {
	return []string{
		"kubelet",
		"--config=" + configFile,
		"--kubeconfig=" + kubeconfigFile,
		"--root-dir=" + rootDir,
		"--hostname-override=" + nodeID,
		"--node-ip=" + nodeIP.String(),
		"--v=" + strconv.Itoa(0),
	}
}
