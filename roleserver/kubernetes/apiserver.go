package kubernetes

import (
	"net"
	"path/filepath"
	"strconv"
	"time"

	"plinth.dev/plinth/platform/layout"
	"plinth.dev/plinth/roleserver/kubernetes/pki"
)

// Files of the controller's components, in the controller directory.
const (
	fileCA                 = "ca.pem"
	fileFrontProxyCA       = "front-proxy-ca.pem"
	fileKubeletServingCA   = "kubelet-serving-ca.pem"
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
	fileAuditPolicy        = "audit-policy.json"
	fileEncryption         = "encryption.json"
	serviceAccountIssuer   = "https://kubernetes.default.svc." + layout.ClusterDomain
	apiServerLocalEndpoint = "https://127.0.0.1:6443"
)

// apiserverArgs are kube-apiserver's flags. f are the paths of the
// controller's files; etcdSocket is the endpoint confined to /kubernetes/
// (consensus ServeKubernetes), so the API server never sees the curator's
// keys. Authorization is the decommissioned nodes' webhook, Node and
// RBAC; the kubelet's serving certificate is verified against the
// kubelet serving CA.
func apiserverArgs(f map[string]string, advertise net.IP, etcdSocket string) []string {
	args := []string{
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
		"--kubelet-certificate-authority=" + f[fileKubeletServingCA],
		"--kubelet-preferred-address-types=InternalIP",
		"--proxy-client-cert-file=" + f[fileFrontProxyCert],
		"--proxy-client-key-file=" + f[fileFrontProxyKey],
		"--requestheader-client-ca-file=" + f[fileFrontProxyCA],
		"--requestheader-allowed-names=front-proxy-client",
		"--requestheader-extra-headers-prefix=X-Remote-Extra-",
		"--requestheader-group-headers=X-Remote-Group",
		"--requestheader-username-headers=X-Remote-User",
		// Aggregated APIs (the metrics servers) straight to an endpoint
		// of their Service: a controller need not be a worker with
		// kube-proxy's Service routes.
		"--enable-aggregator-routing=true",
		"--service-account-key-file=" + f[fileServiceAccountPub],
		"--service-account-signing-key-file=" + f[fileServiceAccountKey],
		"--service-account-issuer=" + serviceAccountIssuer,
		"--service-cluster-ip-range=" + layout.ServiceCIDR,
		// The decommissioned nodes' webhook, Node, RBAC (authzwebhook.go).
		"--authorization-config=" + f[fileAuthorization],
		// Compaction is the consensus service's job (the confined
		// endpoint refuses Compact), and it writes compact_rev_key as
		// the API server's compactor would (consensus/compactor.go). The
		// API server learns of compactions only through its compactor's
		// watch of that key, and starts the compactor only for a
		// non-zero interval: so a year, after which its first own
		// compaction would only be refused.
		"--etcd-compaction-interval=" + apiServerCompactionInterval.String(),
		"--allow-privileged=true",
		"--profiling=false",
		"--v=0",
	}
	for _, kind := range APIServerPolicyKinds {
		args = append(args, policyArgs(kind, f)...)
	}
	return args
}

// APIServerPolicyKinds are the policies the API server starts with
// beyond a plain start, each its files and flags: admission (Pod
// Security, the host-path policy), audit, encryption of Secrets.
var APIServerPolicyKinds = []string{"admission", "audit", "encryption"}

// policyArgs are the flags loading policy kind from the files f (paths
// by name).
func policyArgs(kind string, f map[string]string) []string {
	switch kind {
	case "admission":
		// PodSecurity and ValidatingAdmissionPolicy are on by default;
		// admission.json configures both (admission.go).
		return []string{"--enable-admission-plugins=NodeRestriction", "--admission-control-config-file=" + f[fileAdmission]}
	case "audit":
		// Who did what: one event per request on its standard output,
		// which the controller keeps on the data volume (auditlog) and
		// streams into the node's log tree; nothing on a tmpfs file.
		return []string{"--audit-policy-file=" + f[fileAuditPolicy], "--audit-log-path=-", "--audit-log-format=json",
			"--audit-log-truncate-enabled=true", "--audit-log-truncate-max-event-size=" + strconv.Itoa(auditMaxEventSize)}
	case "encryption":
		// Secrets at rest in etcd: secretbox with the curator's keys
		// (pki.SecretsKeys), on tmpfs like every key here.
		return []string{"--encryption-provider-config=" + f[fileEncryption]}
	}
	panic("kubernetes: no API server policy " + kind)
}

// APIServerPolicy is one of APIServerPolicyKinds as the controller
// writes it: its files (name, which may hold a directory, to contents)
// and the flags that load them from the directory they are written to.
type APIServerPolicy struct {
	Files map[string][]byte
	Args  []string
}

// APIServerPolicies are the API server's policies, by kind, as a
// controller with admission policy p and Secrets keys k writes them into
// dir: the same files and flags as apiserverFiles and apiserverArgs.
// plinthbench's calibration starts the bare API server with each, to
// weigh what it costs alone.
func APIServerPolicies(dir string, p AdmissionPolicy, k *pki.SecretsKeys) map[string]APIServerPolicy {
	all := policyFiles(dir, p, k)
	out := map[string]APIServerPolicy{}
	for _, kind := range APIServerPolicyKinds {
		pol := APIServerPolicy{Files: map[string][]byte{}}
		paths := map[string]string{}
		for _, name := range policyFileNames[kind] {
			pol.Files[name] = all[name]
			paths[name] = filepath.Join(dir, name)
		}
		pol.Args = policyArgs(kind, paths)
		out[kind] = pol
	}
	return out
}

// policyFileNames are each policy's files (the admission configuration
// names the directory of the host-path policy).
var policyFileNames = map[string][]string{
	"admission":  {fileAdmission, fileHostPathsPolicy, fileLocalVolumesPolicy, fileExternalIPsPolicy, filePodSecurityLabelsPolicy},
	"audit":      {fileAuditPolicy},
	"encryption": {fileEncryption},
}

// policyFiles are every policy's files (dir: where they go).
func policyFiles(dir string, p AdmissionPolicy, k *pki.SecretsKeys) files {
	f := admissionFiles(dir, p)
	f[fileAuditPolicy] = auditPolicy
	f[fileEncryption] = k.EncryptionConfiguration()
	return f
}

// auditPolicy is the API server's audit policy, first matching rule
// first: nothing for health probes; Metadata (who, what, when, the
// answer's code; never a body) for Secrets and tokens (a service
// account's token request, a TokenReview: their bodies are
// credentials), whatever the verb, so no later rule can ever log one's
// contents; the requests and answers themselves for changes of RBAC (who
// gave whom which rights) and for exec, attach and port-forward into
// pods (their options: the command run); Metadata for everything else,
// reads of RBAC objects included (the objects say nothing the audit
// needs, and a controller's list of every role would fill the stream).
// The first stage (request received) is left out: the completed one says
// it all.
var auditPolicy = mustJSON(map[string]any{
	"apiVersion": "audit.k8s.io/v1",
	"kind":       "Policy",
	"omitStages": []string{"RequestReceived"},
	"rules": []any{
		// Health probes (the core's own readiness check polls /readyz
		// four times a second while the API server starts): anonymous
		// and a third of the events of a start, they say nothing.
		map[string]any{"level": "None", "nonResourceURLs": []string{"/healthz*", "/readyz*", "/livez*"}},
		map[string]any{"level": "Metadata", "resources": []any{
			map[string]any{"group": "", "resources": []string{"secrets", "serviceaccounts/token"}},
			map[string]any{"group": "authentication.k8s.io", "resources": []string{"tokenreviews"}},
		}},
		map[string]any{"level": "RequestResponse", "verbs": auditWriteVerbs, "resources": []any{
			map[string]any{"group": "rbac.authorization.k8s.io"},
		}},
		map[string]any{"level": "RequestResponse", "resources": []any{
			map[string]any{"group": "", "resources": []string{"pods/exec", "pods/attach", "pods/portforward"}},
		}},
		map[string]any{"level": "Metadata"},
	},
})

// auditWriteVerbs are the verbs that change objects.
var auditWriteVerbs = []string{"create", "update", "patch", "delete", "deletecollection"}

// auditMaxEventSize bounds each audit event in bytes (the API server's
// --audit-log-truncate-max-event-size): a larger one loses its request
// and answer bodies, and is dropped if that is not enough. The live
// stream keeps auditEntries events (controller.go), so it holds at most
// auditEntries × auditMaxEventSize bytes (64 MiB; a Metadata event is
// about 1 KiB, so some 4 MiB in practice): the log tree bounds streams
// in entries, not bytes. The store on the data volume (auditlog) bounds
// each class in bytes.
const auditMaxEventSize = 16 << 10

// apiServerCompactionInterval is the API server's
// --etcd-compaction-interval (see apiserverArgs): long enough that it
// never compacts, non-zero so that it watches the consensus service's
// compactions.
const apiServerCompactionInterval = 365 * 24 * time.Hour

// leaderElection is the controller manager's and scheduler's leader
// election (lease duration, renew deadline, retry period; Kubernetes's
// defaults are 15 s, 10 s, 2 s). A leader that cannot renew its lease
// within the renew deadline exits, and is restarted: a whole start, which
// then waits out its predecessor's lease. Each renewal request times out
// after half the renew deadline (client-go's resourcelock), so two
// answers slower than that in a row lose the lease. On a busy machine
// (every component starting at once, a VM without hardware
// virtualisation) the API server's answers take that long: in a
// conformance run on two TCG nodes 17 of 708 lease updates took over
// 10 s, and each loss stops every controller for a minute or more. A
// renew deadline of 40 s needs two answers slower than 20 s in a row;
// the price is a successor that takes over after up to 60 s. Renewing
// every 10 s instead of 4 (each renewal is an etcd write sent to every
// lease watcher) leaves room for four tries and costs an idle node less
// CPU; a successor notices an expired lease up to 10 s later.
var leaderElection = struct{ lease, renew, retry time.Duration }{60 * time.Second, 40 * time.Second, 10 * time.Second}

// leaderElectionArgs are the controller manager's and scheduler's leader
// election flags.
func leaderElectionArgs() []string {
	return []string{
		"--leader-elect=true",
		"--leader-elect-lease-duration=" + leaderElection.lease.String(),
		"--leader-elect-renew-deadline=" + leaderElection.renew.String(),
		"--leader-elect-retry-period=" + leaderElection.retry.String(),
	}
}

// controllerManagerArgs are kube-controller-manager's flags: its pod
// CIDR allocator is off (nodeIPAM's), and so is the CSR signer (kubelets
// get their certificates from the curator).
func controllerManagerArgs(f map[string]string, flexDir string) []string {
	return append([]string{
		"controller-manager",
		"--kubeconfig=" + f[fileControllerManager],
		"--authentication-kubeconfig=" + f[fileControllerManager],
		"--authorization-kubeconfig=" + f[fileControllerManager],
		"--bind-address=127.0.0.1",
		"--use-service-account-credentials=true",
		"--controllers=*,-csrsigning,-csrapproving,-csrcleaner,-bootstrapsigner,-tokencleaner",
		// Pod CIDRs are the core's node IPAM's (nodeipam.go): set at
		// once, not after every controller here has started.
		"--allocate-node-cidrs=false",
		"--cluster-cidr=" + layout.ClusterCIDR,
		"--service-cluster-ip-range=" + layout.ServiceCIDR,
		"--root-ca-file=" + f[fileCA],
		"--service-account-private-key-file=" + f[fileServiceAccountKey],
		// The default (/usr/libexec/...) is on the read-only system image.
		"--flex-volume-plugin-dir=" + flexDir,
		"--profiling=false",
		"--v=0",
	}, leaderElectionArgs()...)
}

// schedulerArgs are kube-scheduler's flags.
func schedulerArgs(f map[string]string) []string {
	return append([]string{
		"scheduler",
		"--kubeconfig=" + f[fileScheduler],
		"--authentication-kubeconfig=" + f[fileScheduler],
		"--authorization-kubeconfig=" + f[fileScheduler],
		"--bind-address=127.0.0.1",
		"--profiling=false",
		"--v=0",
	}, leaderElectionArgs()...)
}
