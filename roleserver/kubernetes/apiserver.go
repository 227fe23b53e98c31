package kubernetes

import (
	"net"
	"strconv"

	"plinth.dev/plinth/platform/layout"
)

// Files of the controller's components, in the controller directory.
const (
	fileCA                 = "ca.pem"
	fileFrontProxyCA       = "front-proxy-ca.pem"
	fileAPIServerCert      = "apiserver.pem"
	fileAPIServerKey       = "apiserver-key.pem"
	fileKubeletClientCert  = "apiserver-kubelet-client.pem"
	fileKubeletClientKey   = "apiserver-kubelet-client-key.pem"
	fileFrontProxyCert     = "front-proxy-client.pem"
	fileFrontProxyKey      = "front-proxy-client-key.pem"
	fileServiceAccountPub  = "service-account.pub"
	fileServiceAccountKey  = "service-account-key.pem"
	fileControllerManager  = "controller-manager.kubeconfig"
	fileScheduler          = "scheduler.kubeconfig"
	serviceAccountIssuer   = "https://kubernetes.default.svc." + layout.ClusterDomain
	apiServerLocalEndpoint = "https://127.0.0.1:6443"
)

// apiserverArgs are kube-apiserver's flags. f are the paths of the
// controller's files; etcdSocket is the endpoint confined to /kubernetes/
// (consensus ServeKubernetes), so the API server never sees the curator's
// keys. Authorization is Node + RBAC; the kubelet's serving certificate
// is verified against the Kubernetes CA.
func apiserverArgs(f map[string]string, advertise net.IP, etcdSocket string) []string {
	return []string{
		"apiserver",
		"--advertise-address=" + advertise.String(),
		"--bind-address=0.0.0.0",
		"--secure-port=" + strconv.Itoa(layout.KubernetesAPIPort),
		"--etcd-servers=unix://" + etcdSocket,
		"--etcd-prefix=/registry",
		"--tls-cert-file=" + f[fileAPIServerCert],
		"--tls-private-key-file=" + f[fileAPIServerKey],
		"--client-ca-file=" + f[fileCA],
		"--kubelet-client-certificate=" + f[fileKubeletClientCert],
		"--kubelet-client-key=" + f[fileKubeletClientKey],
		"--kubelet-certificate-authority=" + f[fileCA],
		"--kubelet-preferred-address-types=InternalIP",
		"--proxy-client-cert-file=" + f[fileFrontProxyCert],
		"--proxy-client-key-file=" + f[fileFrontProxyKey],
		"--requestheader-client-ca-file=" + f[fileFrontProxyCA],
		"--requestheader-allowed-names=front-proxy-client",
		"--requestheader-extra-headers-prefix=X-Remote-Extra-",
		"--requestheader-group-headers=X-Remote-Group",
		"--requestheader-username-headers=X-Remote-User",
		"--service-account-key-file=" + f[fileServiceAccountPub],
		"--service-account-signing-key-file=" + f[fileServiceAccountKey],
		"--service-account-issuer=" + serviceAccountIssuer,
		"--service-cluster-ip-range=" + layout.ServiceCIDR,
		"--authorization-mode=Node,RBAC",
		"--enable-admission-plugins=NodeRestriction",
		"--allow-privileged=true",
		"--profiling=false",
		"--v=0",
	}
}

// leaderElection is the controller manager's and scheduler's leader
// election: twice Kubernetes's default times (15 s, 10 s, 2 s). A
// leader that cannot renew in time exits (and is restarted), and a
// controller's start — every component at once on a busy machine, or a
// VM without hardware virtualisation — can hold the API server's answers
// up for longer than 10 s; a dead leader's successor takes over 15 s
// later than with the defaults.
var leaderElection = struct{ lease, renew, retry string }{"30s", "20s", "4s"}

// controllerManagerArgs are kube-controller-manager's flags: pod CIDRs
// are allocated per node (/NodeCIDRMaskSize of ClusterCIDR), and the CSR
// signer is off (kubelets get their certificates from the curator).
func controllerManagerArgs(f map[string]string, flexDir string) []string {
	return []string{
		"controller-manager",
		"--kubeconfig=" + f[fileControllerManager],
		"--authentication-kubeconfig=" + f[fileControllerManager],
		"--authorization-kubeconfig=" + f[fileControllerManager],
		"--bind-address=127.0.0.1",
		"--leader-elect=true",
		"--leader-elect-lease-duration=" + leaderElection.lease,
		"--leader-elect-renew-deadline=" + leaderElection.renew,
		"--leader-elect-retry-period=" + leaderElection.retry,
		"--use-service-account-credentials=true",
		"--controllers=*,-csrsigning,-csrapproving,-csrcleaner,-bootstrapsigner,-tokencleaner",
		"--allocate-node-cidrs=true",
		"--cluster-cidr=" + layout.ClusterCIDR,
		"--node-cidr-mask-size=" + strconv.Itoa(layout.NodeCIDRMaskSize),
		"--service-cluster-ip-range=" + layout.ServiceCIDR,
		"--root-ca-file=" + f[fileCA],
		"--service-account-private-key-file=" + f[fileServiceAccountKey],
		// The default (/usr/libexec/...) is on the read-only system image.
		"--flex-volume-plugin-dir=" + flexDir,
		"--profiling=false",
		"--v=0",
	}
}

// schedulerArgs are kube-scheduler's flags.
func schedulerArgs(f map[string]string) []string {
	return []string{
		"scheduler",
		"--kubeconfig=" + f[fileScheduler],
		"--authentication-kubeconfig=" + f[fileScheduler],
		"--authorization-kubeconfig=" + f[fileScheduler],
		"--bind-address=127.0.0.1",
		"--leader-elect=true",
		"--leader-elect-lease-duration=" + leaderElection.lease,
		"--leader-elect-renew-deadline=" + leaderElection.renew,
		"--leader-elect-retry-period=" + leaderElection.retry,
		"--profiling=false",
		"--v=0",
	}
}
