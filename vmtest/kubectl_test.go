//go:build built

package vmtest

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"plinth.dev/plinth/launch"
	"plinth.dev/plinth/platform/layout"
)

// runPrinted runs shell command lines as a user pastes them (in dir, ""
// for the test's), stopping at the first that fails, and returns their
// output.
func runPrinted(t *testing.T, ctx context.Context, dir string, lines []string) string {
	t.Helper()
	ctx, cancel := context.WithTimeout(ctx, 10*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, "bash", "-euo", "pipefail", "-c", strings.Join(lines, "\n"))
	cmd.Dir = dir
	out, err := cmd.CombinedOutput()
	shown := strings.Split(strings.TrimRight(string(out), "\n"), "\n")
	if len(shown) > 20 {
		shown = append([]string{fmt.Sprintf("(%d lines before)", len(shown)-20)}, shown[len(shown)-20:]...)
	}
	t.Logf("ran as printed:\n  %s\n%s", strings.Join(lines, "\n  "), strings.Join(shown, "\n"))
	if err != nil {
		t.Fatalf("the printed commands failed: %v", err)
	}
	return string(out)
}

// kubectl runs the kubectl built from the nodes' Kubernetes version
// (PLINTH_KUBECTL, built by the Makefile) with a kubeconfig.
type kubectl struct {
	bin, kubeconfig string
}

func newKubectl(t *testing.T, kubeconfig string) kubectl {
	t.Helper()
	bin := os.Getenv("PLINTH_KUBECTL")
	if bin == "" {
		t.Fatal("PLINTH_KUBECTL unset: run `make vmtest`, which builds out/bin/kubectl")
	}
	return kubectl{bin: bin, kubeconfig: kubeconfig}
}

func (k kubectl) try(ctx context.Context, args ...string) (string, error) {
	return k.tryFor(ctx, 2*time.Minute, args...)
}

// tryFor is try with a timeout for kubectl's whole run.
func (k kubectl) tryFor(ctx context.Context, timeout time.Duration, args ...string) (string, error) {
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	cmd := exec.CommandContext(ctx, k.bin, append([]string{"--kubeconfig", k.kubeconfig, "--request-timeout=60s"}, args...)...)
	out, err := cmd.CombinedOutput()
	if err != nil {
		return string(out), fmt.Errorf("kubectl %s: %v: %s", strings.Join(args, " "), err, strings.TrimSpace(string(out)))
	}
	return string(out), nil
}

func (k kubectl) run(t *testing.T, ctx context.Context, args ...string) string {
	t.Helper()
	out, err := k.try(ctx, args...)
	if err != nil {
		t.Fatal(err)
	}
	return out
}

// remove deletes objects (kind/name) at once and waits up to timeout
// until each is gone or replaced by a new one of the same name (a
// StatefulSet's pod). A plain kubectl delete waits within its 60 s
// request timeout, which a pod's graceful stop and volume teardown can
// pass on a loaded TCG node; and one after another, their stops' waits
// would add up.
func (k kubectl) remove(t *testing.T, ctx context.Context, timeout time.Duration, objects ...string) {
	t.Helper()
	uids := make([]string, len(objects))
	for i, o := range objects {
		uids[i] = k.run(t, ctx, "get", o, "-o", "jsonpath={.metadata.uid}")
	}
	k.run(t, ctx, append([]string{"delete", "--wait=false"}, objects...)...)
	for i, o := range objects {
		kind, name, _ := strings.Cut(o, "/")
		k.until(t, ctx, timeout, o+" ("+uids[i]+") is deleted", func(out string) bool { return out != uids[i] },
			"get", kind, name, "--ignore-not-found", "-o", "jsonpath={.metadata.uid}")
	}
}

// wait is kubectl wait --for=condition for what, up to timeout.
func (k kubectl) wait(ctx context.Context, timeout time.Duration, condition string, what ...string) (string, error) {
	args := append([]string{"wait", "--for=condition=" + condition, fmt.Sprintf("--timeout=%ds", int(timeout.Seconds()))}, what...)
	return k.tryFor(ctx, timeout+time.Minute, args...)
}

// until retries kubectl until ok accepts its output or timeout passes.
func (k kubectl) until(t *testing.T, ctx context.Context, timeout time.Duration, what string, ok func(string) bool, args ...string) string {
	t.Helper()
	return k.untilExplained(t, ctx, timeout, what, ok, nil, args...)
}

// untilExplained is until whose failure also says what explain finds
// (nil: nothing), gathered when the wait has failed: what the cluster
// saw, for a failure that happens on CI only.
func (k kubectl) untilExplained(t *testing.T, ctx context.Context, timeout time.Duration, what string, ok func(string) bool, explain func() string, args ...string) string {
	t.Helper()
	deadline := time.Now().Add(timeout)
	var out string
	var err error
	for time.Now().Before(deadline) {
		if out, err = k.try(ctx, args...); err == nil && ok(out) {
			return out
		}
		time.Sleep(untilInterval)
	}
	why := ""
	if explain != nil {
		why = "\n" + explain()
	}
	t.Fatalf("%s: not within %v (last output %q, %v)%s", what, timeout, out, err, why)
	return ""
}

// untilInterval is how long until waits between kubectl's tries: each
// is a process, a TLS handshake and requests the API server serves
// beside the control plane's own, and the test waits on several things
// at once.
const untilInterval = 2 * time.Second

// explainPod is what the cluster and the node say about a pod that does
// not become ready, a line each (a CI report keeps a failed test's last
// lines): its last events, and the last lines of the node's kubelet and
// containerd logs that name it (its sandbox and containers are what a
// restarted node has to tear down and create again).
func explainPod(ctx context.Context, c *launch.Cluster, ctl plinthctl, k kubectl, n *launch.ClusterNode, pod string) string {
	var lines []string
	events, err := k.try(ctx, "get", "events", "--field-selector", "involvedObject.name="+pod, "--sort-by=.lastTimestamp",
		"-o", "custom-columns=LAST:.lastTimestamp,REASON:.reason,COUNT:.count,MESSAGE:.message", "--no-headers")
	if err != nil {
		events = err.Error()
	}
	for _, l := range lastLines(events, 3) {
		lines = append(lines, "event: "+l)
	}
	for _, r := range []string{"kubelet", "containerd"} {
		// The kubelet's pod="default/b", containerd's
		// PodSandboxMetadata{Name:b,…}.
		lines = append(lines, logLines(ctx, c, ctl, n, "worker."+r, 3, `"default/`+pod+`"`, "{Name:"+pod+",")...)
	}
	return strings.Join(lines, "\n")
}

// logLines is the last count lines of component's log on node n
// (component under root.roleserver.kubernetes) that contain any of
// words, each prefixed with the component's name; or why the log could
// not be read.
func logLines(ctx context.Context, c *launch.Cluster, ctl plinthctl, n *launch.ClusterNode, component string, count int, words ...string) []string {
	name := component[strings.LastIndex(component, ".")+1:]
	logs, err := ctl.output(ctx, "node", "logs", "--config", c.OwnerDir(), "--dn", "root.roleserver.kubernetes."+component, n.ID())
	if err != nil {
		return []string{fmt.Sprintf("%s log of %s: %v", name, n.Name, err)}
	}
	var named []string
	for _, l := range strings.Split(logs, "\n") {
		if slices.ContainsFunc(words, func(w string) bool { return strings.Contains(l, w) }) {
			named = append(named, name+": "+l)
		}
	}
	return named[max(0, len(named)-count):]
}

// lastLines is the last n lines of s.
func lastLines(s string, n int) []string {
	lines := strings.Split(strings.TrimRight(s, "\n"), "\n")
	return lines[max(0, len(lines)-n):]
}

// apply is kubectl apply -f - with manifest, tried again for up to
// applyTimeout: on a saturated machine an API server can answer one of
// apply's requests too late, and applying again is what its user would
// do.
func (k kubectl) apply(t *testing.T, ctx context.Context, manifest string) {
	t.Helper()
	k.applyAtOnce(t, ctx, []string{manifest})
}

// applyAtOnce applies each group of manifests (joined, one kubectl
// apply a group, tried again as apply is) side by side, and waits for
// all: one apply creates its objects one after another, a GET and a
// POST each, and a busy API server under TCG answered each in 1-13 s
// (a GET of a missing object included: its etcd reads averaged a third
// of a second), so twenty objects in one apply took 2.5 minutes.
func (k kubectl) applyAtOnce(t *testing.T, ctx context.Context, groups ...[]string) {
	t.Helper()
	errs := make([]error, len(groups))
	var wg sync.WaitGroup
	for i, g := range groups {
		wg.Add(1)
		go func() {
			defer wg.Done()
			manifest := strings.Join(g, "\n---\n")
			if out, err := k.retried(t, ctx, manifest, func(_ string, err error) bool { return err == nil }, "apply", "-f", "-"); err != nil {
				errs[i] = fmt.Errorf("kubectl apply: %v\n%s\n%s", err, out, manifest)
			}
		}()
	}
	wg.Wait()
	if err := errors.Join(errs...); err != nil {
		t.Fatal(err)
	}
}

// retried runs kubectl with args and manifest on its stdin until done
// accepts its output and error, or applyTimeout passes, 2 s between
// tries; it returns the last try's.
func (k kubectl) retried(t *testing.T, ctx context.Context, manifest string, done func(out string, err error) bool, args ...string) (string, error) {
	t.Helper()
	deadline := time.Now().Add(applyTimeout)
	for {
		cmd := exec.CommandContext(ctx, k.bin, append([]string{"--kubeconfig", k.kubeconfig}, args...)...)
		cmd.Stdin = strings.NewReader(manifest)
		b, err := cmd.CombinedOutput()
		out := string(b)
		if done(out, err) || time.Now().After(deadline) || ctx.Err() != nil {
			return out, err
		}
		t.Logf("kubectl %s: %v (trying again)\n%s", strings.Join(args, " "), err, out)
		time.Sleep(2 * time.Second)
	}
}

// applyTimeout bounds apply's tries.
const applyTimeout = 3 * time.Minute

// deploymentOn is a Deployment "web" of the test image serving HTTP, its
// pods on node (by the kubernetes.io/hostname label the kubelet sets).
func deploymentOn(node string) string {
	return deployment("web", "nodeSelector: {kubernetes.io/hostname: "+node+"}")
}

// moverLabel marks the node the mover Deployment's pod prefers.
const moverLabel = "test.plinth.dev/mover"

// mover is a Deployment "mover" of the test image whose pod prefers the
// node labelled moverLabel but may run anywhere: a drain of that node
// moves it. The test moves the label to another node before the drain:
// the replacement then goes there even when a loaded controller manager
// makes it only after the drained node is uncordoned again (seen under
// TCG: its leader election lost while the update ran).
var mover = deployment("mover", `affinity:
  nodeAffinity:
    preferredDuringSchedulingIgnoredDuringExecution:
    - weight: 100
      preference: {matchExpressions: [{key: `+moverLabel+`, operator: Exists}]}`)

// deployment is a one-replica Deployment of the test image serving HTTP,
// its pods labelled app=name, placement (YAML) in their spec.
func deployment(name, placement string) string {
	return `apiVersion: apps/v1
kind: Deployment
metadata: {name: ` + name + `}
spec:
  replicas: 1
  selector: {matchLabels: {app: ` + name + `}}
  template:
    metadata: {labels: {app: ` + name + `}}
    spec:
      ` + strings.ReplaceAll(placement, "\n", "\n      ") + `
      ` + strings.ReplaceAll(outlastOutages, "\n", "\n      ") + `
      containers:
      - name: ` + name + `
        image: ` + layout.TestImage + `
        imagePullPolicy: Never
        args: [serve]
`
}

// outlastOutages (YAML, a pod spec's field) keeps a pod bound to its
// node through the test's outages of it (its role removed, its power
// cut), however slow the machine: by default a pod tolerates a node
// NotReady or unreachable for 5 minutes, then the node lifecycle
// controller evicts it and, for a Deployment, the scheduler puts the new
// pod elsewhere. What moves the test's pods is the drain, which evicts
// whatever the pod tolerates.
const outlastOutages = `tolerations:
- {key: node.kubernetes.io/not-ready, operator: Exists, effect: NoExecute, tolerationSeconds: 3600}
- {key: node.kubernetes.io/unreachable, operator: Exists, effect: NoExecute, tolerationSeconds: 3600}`

// podOn is a pod of the test image serving HTTP, pinned to a node (by
// the scheduler: a cordoned node gets none).
func podOn(name, node string) string {
	return `apiVersion: v1
kind: Pod
metadata: {name: ` + name + `, labels: {app: ` + name + `}}
spec:
  nodeSelector: {kubernetes.io/hostname: ` + node + `}
  ` + strings.ReplaceAll(outlastOutages, "\n", "\n  ") + `
  containers:
  - name: web
    image: ` + layout.TestImage + `
    imagePullPolicy: Never
    args: [serve]
`
}

// selfTestJob resolves kubernetes.default.svc.cluster.local and calls the
// API through the Service VIP with its service account token.
const selfTestJob = `apiVersion: v1
kind: ServiceAccount
metadata: {name: selftest}
---
apiVersion: rbac.authorization.k8s.io/v1
kind: RoleBinding
metadata: {name: selftest-view}
roleRef: {apiGroup: rbac.authorization.k8s.io, kind: ClusterRole, name: view}
subjects: [{kind: ServiceAccount, name: selftest, namespace: default}]
---
apiVersion: batch/v1
kind: Job
metadata: {name: selftest}
spec:
  backoffLimit: 4
  template:
    spec:
      serviceAccountName: selftest
      restartPolicy: Never
      containers:
      - name: selftest
        image: ` + layout.TestImage + `
        imagePullPolicy: Never
        args: [selftest]
`

// nodePortService exposes the pod "b" on KubernetesNodePort.
var nodePortService = fmt.Sprintf(`apiVersion: v1
kind: Service
metadata: {name: b}
spec:
  type: NodePort
  selector: {app: b}
  ports: [{port: 80, targetPort: 8080, nodePort: %d}]
`, launch.KubernetesNodePort)
