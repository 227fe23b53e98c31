//go:build built

package vmtest

import (
	"context"
	"strings"
	"testing"
	"time"

	"plinth.dev/plinth/launch"
	"plinth.dev/plinth/platform/layout"
)

// tenantRBAC gives three tenants the rights a cluster owner gives
// tenants: "tenant" edit in namespace tenant; "creator" create on
// namespaces; "patcher" patch on namespaces and admin in tenant.
const tenantRBAC = `apiVersion: v1
kind: Namespace
metadata: {name: tenant}
---
apiVersion: rbac.authorization.k8s.io/v1
kind: RoleBinding
metadata: {name: tenant-edit, namespace: tenant}
roleRef: {apiGroup: rbac.authorization.k8s.io, kind: ClusterRole, name: edit}
subjects: [{apiGroup: rbac.authorization.k8s.io, kind: User, name: tenant}]
---
apiVersion: rbac.authorization.k8s.io/v1
kind: ClusterRole
metadata: {name: ns-creator}
rules: [{apiGroups: [""], resources: [namespaces], verbs: [create, get]}]
---
apiVersion: rbac.authorization.k8s.io/v1
kind: ClusterRoleBinding
metadata: {name: ns-creator}
roleRef: {apiGroup: rbac.authorization.k8s.io, kind: ClusterRole, name: ns-creator}
subjects: [{apiGroup: rbac.authorization.k8s.io, kind: User, name: creator}]
---
apiVersion: rbac.authorization.k8s.io/v1
kind: ClusterRole
metadata: {name: ns-patcher}
rules: [{apiGroups: [""], resources: [namespaces], verbs: [get, patch]}]
---
apiVersion: rbac.authorization.k8s.io/v1
kind: ClusterRoleBinding
metadata: {name: ns-patcher}
roleRef: {apiGroup: rbac.authorization.k8s.io, kind: ClusterRole, name: ns-patcher}
subjects: [{apiGroup: rbac.authorization.k8s.io, kind: User, name: patcher}]
---
apiVersion: rbac.authorization.k8s.io/v1
kind: RoleBinding
metadata: {name: patcher-admin, namespace: tenant}
roleRef: {apiGroup: rbac.authorization.k8s.io, kind: ClusterRole, name: admin}
subjects: [{apiGroup: rbac.authorization.k8s.io, kind: User, name: patcher}]
`

// attackAsTenants is what tenants try against the cluster with the
// rights tenantRBAC gives them (kubectl --as): with edit, a Service
// whose external IP is the controller's address on the API server's
// and the curator's ports, which would capture every new connection the
// nodes make there (refused: plinth-external-ips); with create on
// namespaces, a namespace labelled privileged; with patch on namespaces,
// labelling one privileged (both refused:
// plinth-pod-security-labels). The owner's privileged namespace is
// attackNode's. After the attempts, the owner's kubectl still reaches
// the API server on the controller's address and both nodes are Ready.
func attackAsTenants(t *testing.T, ctx context.Context, k kubectl, controllerIP string) {
	t.Helper()
	k.apply(t, ctx, tenantRBAC)
	// refusedAs runs kubectl as user until the API server's admission
	// answers (RBAC's cache learns the bindings a moment after they are
	// made: its refusal says "cannot") and returns the answer.
	refusedAs := func(user, policy, manifest string, args ...string) {
		t.Helper()
		out, err := k.retried(t, ctx, manifest, func(out string, err error) bool {
			return err == nil || strings.Contains(out, policy) || strings.Contains(out, "Error from server (Invalid)")
		}, append([]string{"--as=" + user, "--request-timeout=60s"}, args...)...)
		if err == nil || !strings.Contains(out, policy) {
			t.Errorf("kubectl --as=%s %s: %v\n%s\nwant a refusal by %s", user, strings.Join(args, " "), err, out, policy)
		}
	}
	refusedAs("tenant", "plinth-external-ips.static.k8s.io", `apiVersion: v1
kind: Service
metadata: {name: capture, namespace: tenant}
spec:
  externalIPs: [`+controllerIP+`]
  ports: [{name: api, port: 6443}, {name: curator, port: 7835}, {name: node, port: 7834}]
`, "create", "--validate=false", "-f", "-")
	refusedAs("creator", "plinth-pod-security-labels.static.k8s.io", `apiVersion: v1
kind: Namespace
metadata: {name: mine, labels: {pod-security.kubernetes.io/enforce: privileged}}
`, "create", "--validate=false", "-f", "-")
	refusedAs("patcher", "plinth-pod-security-labels.static.k8s.io", "", "label", "namespace", "tenant", "pod-security.kubernetes.io/enforce=privileged")
	for _, out := range strings.Fields(k.run(t, ctx, "get", "nodes", "-o", `jsonpath={.items[*].status.conditions[?(@.type=="Ready")].status}`)) {
		if out != "True" {
			t.Errorf("a node is not Ready after the tenants' attempts: %s", out)
		}
	}
}

// nodeIP is n's address as its Kubernetes node reports it.
func nodeIP(t *testing.T, ctx context.Context, k kubectl, n *launch.ClusterNode) string {
	t.Helper()
	ip := strings.TrimSpace(k.run(t, ctx, "get", "node", n.ID(), "-o", `jsonpath={.status.addresses[?(@.type=="InternalIP")].address}`))
	if ip == "" {
		t.Fatalf("%s reports no InternalIP", n.Name)
	}
	return ip
}

// attackTmpLink: a pod of a namespace whose level allows host paths
// plants a link in the node's /tmp to the data volume; another pod's host
// path through it gets no container (the kernel follows no link on /tmp,
// so containerd's stat of the path fails: ELOOP) and never runs, so it
// sees nothing of /data. A plain directory below /tmp is a host path as
// the upstream conformance Jobs use it (DirectoryOrCreate, written).
func attackTmpLink(t *testing.T, ctx context.Context, k kubectl, node string) {
	t.Helper()
	pod := func(name, volume, args string) string { return hostPathPod(name, node, volume, args) }
	k.apply(t, ctx, pod("planter", `{path: /tmp, type: Directory}`, "link, /data, /host/plinth-link"))
	k.apply(t, ctx, pod("tmp-user", `{path: /tmp/job-e2e-plinth, type: DirectoryOrCreate}`, "write, /host/marker, kept"))
	phase := func(name, want string) {
		t.Helper()
		k.until(t, ctx, 5*time.Minute, "pod "+name+" "+want, func(out string) bool { return out == want },
			"get", "-n", "attack", "pod", name, "-o", "jsonpath={.status.phase}")
	}
	phase("planter", "Succeeded")
	phase("tmp-user", "Succeeded")
	k.apply(t, ctx, pod("follower", `{path: /tmp/plinth-link}`, "pause"))
	k.until(t, ctx, 5*time.Minute, "pod follower's container is not made through the link", func(out string) bool {
		return strings.HasPrefix(out, "CreateContainerError|") && strings.Contains(out, "too many levels of symbolic links")
	}, "get", "-n", "attack", "pod", "follower", "-o", `jsonpath={.status.containerStatuses[0].state.waiting.reason}|{.status.containerStatuses[0].state.waiting.message}`)
	if out := k.run(t, ctx, "get", "-n", "attack", "pod", "follower", "-o", "jsonpath={.status.phase}"); out == "Running" {
		t.Errorf("the pod whose host path is a link in /tmp runs")
	}
	k.run(t, ctx, "delete", "-n", "attack", "pod", "planter", "tmp-user", "follower", "--wait=false")
}

// hostPathPod is a pod of namespace attack on node running the test
// image with args, a host path volume (its YAML) mounted at /host.
func hostPathPod(name, node, volume, args string) string {
	return `apiVersion: v1
kind: Pod
metadata: {name: ` + name + `, namespace: attack}
spec:
  nodeSelector: {kubernetes.io/hostname: ` + node + `}
  restartPolicy: Never
  containers:
  - name: c
    image: ` + layout.TestImage + `
    imagePullPolicy: Never
    args: [` + args + `]
    volumeMounts: [{name: h, mountPath: /host}]
  volumes: [{name: h, hostPath: ` + volume + `}]
`
}

// attackEtcHosts: a pod of a namespace whose level allows host paths
// mounts the node's /etc/hosts as the upstream conformance suite does
// (FileOrCreate, writable) and tries to point the other node's ID at an
// address of its own: the write fails (the file is the read-only
// image's), and another pod reads only localhost there. The node finds
// its etcd peers from a map of its own (platform/nodenames), which
// TestCluster's members use. It applies its pods and returns the check,
// so that they start beside another attack's.
func attackEtcHosts(t *testing.T, ctx context.Context, k kubectl, node, other string) (check func()) {
	t.Helper()
	volume := `{path: ` + layout.HostsFile + `, type: FileOrCreate}`
	k.apply(t, ctx, hostPathPod("hosts-writer", node, volume, `write, /host, "10.66.66.66 `+other+`\n"`))
	k.apply(t, ctx, hostPathPod("hosts-reader", node, volume, "cat, /host"))
	return func() { checkEtcHostsAttack(t, ctx, k) }
}

func checkEtcHostsAttack(t *testing.T, ctx context.Context, k kubectl) {
	t.Helper()
	for name, want := range map[string]string{"hosts-writer": "Failed", "hosts-reader": "Succeeded"} {
		k.until(t, ctx, 5*time.Minute, "pod "+name+" "+want, func(out string) bool { return out == want },
			"get", "-n", "attack", "pod", name, "-o", "jsonpath={.status.phase}")
	}
	if out := k.run(t, ctx, "logs", "-n", "attack", "hosts-writer"); !strings.Contains(out, "read-only file system") {
		t.Errorf("a pod's write to the node's %s: %q, want a read-only file system", layout.HostsFile, out)
	}
	if out := k.run(t, ctx, "logs", "-n", "attack", "hosts-reader"); out != layout.HostsFileContent {
		t.Errorf("the node's %s as a pod reads it: %q, want %q", layout.HostsFile, out, layout.HostsFileContent)
	}
	k.run(t, ctx, "delete", "-n", "attack", "pod", "hosts-writer", "hosts-reader", "--wait=false")
}
