//go:build built

package vmtest

import (
	"context"
	"crypto/tls"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"plinth.dev/plinth/api/clusterpb"
	"plinth.dev/plinth/launch"
	"plinth.dev/plinth/platform/layout"
	"plinth.dev/plinth/roleserver/kubernetes"
)

// TestKubernetesTwoNodes: a controller+worker and a worker-only node,
// the worker booted from its disk (OVMF + swtpm: it is updated last).
// Pods on the two nodes reach each other by pod IP (routes between the
// nodes' pod CIDRs), an in-cluster Job resolves the API's name through the
// node's DNS and calls it through the Service VIP with its service
// account token, and a NodePort Service answers from the host through the
// harness's forwarded port. Pods pull from the harness's registry
// (pull_test.go), keep data in local volumes (volumes_test.go), are
// isolated by NetworkPolicy (netpol_test.go), and kubectl top and an
// autoscaler read their metrics (metrics_test.go). Then the worker-only node loses its KubernetesWorker
// role (it reports its Node NotReady at once, its pod stops), has its
// power cut and gets the role back while off (Ready again at its boot,
// its pod runs again and is reachable; the next image, staged meanwhile,
// stays staged across it; with the registry down, the image it pulled
// before starts and a pull waits in back-off), and at last reboots into
// that update, drained first and uncordoned after (updateWorker), and
// runs the user image the next image carries (checkUserImages). Before
// that, on the first node, which has every role as a one-node cluster's
// node does: a Deployment of the test image rolls out, logs and exec
// work, a deleted pod is replaced.
func TestKubernetesTwoNodes(t *testing.T) {
	img := testImage(t)
	ctx, cancel := context.WithTimeout(context.Background(), 40*time.Minute)
	defer cancel()
	dir := testDir(t)
	reg, digest := startPullRegistry(t)
	regLog, err := os.Create(filepath.Join(dir, "registry.log"))
	if err != nil {
		t.Fatal(err)
	}
	defer regLog.Close()
	reg.LogRequests(regLog)
	pushConformanceImages(t, reg)
	c, err := launch.LaunchCluster(ctx, launch.ClusterOptions{Nodes: 1, Image: img, Dir: dir, DiskSizeBytes: 4 << 30, Kubernetes: true, Registry: reg, Progress: logWriter{t}})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	ctl := buildPlinthctl(t)
	// Set by one step, used by the later ones. The helpers take the t of
	// the step that calls them.
	var (
		first, second *launch.ClusterNode
		k             kubectl
		ready         func(t *testing.T, n *launch.ClusterNode, want bool, timeout time.Duration)
		next          *launch.Image
		staged        func(t *testing.T)
		web           string
		reachB        func(t *testing.T, when string, restarts int) (ip string)
		ipB           string
	)

	step(t, "pull-policy", func(t *testing.T) {
		// The registries are in the policy before a kubelet starts (the
		// first node's waits for its API server, minutes away): a later
		// change of the registries with credentials restarts the kubelets.
		setPullPolicy(t, ctx, c, ctl, reg)
		refuseMalformedRegistry(t, ctx, c)
	})

	step(t, "add-worker", func(t *testing.T) {
		// The worker boots from its disk, to be updated; the controller by
		// -kernel, its control plane faster from the initramfs.
		var err error
		second, err = c.AddNode(ctx, launch.FromDisk())
		if err != nil {
			t.Fatal(err)
		}
		first = c.Nodes()[0]
	})

	step(t, "owner-commands", func(t *testing.T) {
		// The kubeconfig is what the commands plinthctl launch prints for
		// this cluster write, run as printed.
		k = newKubectl(t, filepath.Join(dir, "kubeconfig"))
		// (plinthctl node list names both nodes; kubectl get nodes succeeds,
		// though the kubelets may not have registered yet.)
		if out := runPrinted(t, ctx, "", c.OwnerCommands(string(ctl), k.bin)); !strings.Contains(out, first.ID()) || !strings.Contains(out, second.ID()) {
			t.Fatalf("the commands plinthctl launch prints do not list both nodes:\n%s", out)
		}
	})

	step(t, "nodes-ready", func(t *testing.T) {
		// The API server answers: each node pulls the smoke's images once
		// Ready.
		prepullSmokeImages(t, ctx, k)
		ready = func(t *testing.T, n *launch.ClusterNode, want bool, timeout time.Duration) {
			t.Helper()
			k.until(t, ctx, timeout, fmt.Sprintf("%s Ready=%v", n.Name, want), func(out string) bool { return (out == "True") == want },
				"get", "node", n.ID(), "-o", `jsonpath={.status.conditions[?(@.type=="Ready")].status}`)
		}
		ready(t, first, true, 15*time.Minute)
		ready(t, second, true, 15*time.Minute)
		pullStart := time.Now()
		smokeImagesPulled(t, ctx, k, 2)
		t.Logf("the smoke's images pulled on both nodes (%v after both were Ready)", time.Since(pullStart).Round(time.Second))
	})

	step(t, "stage-update", func(t *testing.T) {
		next = nextImage(t)
		staged = stageUpdate(t, ctx, c, ctl, second, next)
	})

	step(t, "smoke", func(t *testing.T) {
		// The conformance smoke runs first, on a cluster with nothing else
		// to do (smoke_test.go).
		runSmoke(t, ctx, dir, k)
	})

	step(t, "apply-workloads", func(t *testing.T) {
		// Every workload the checks below use is applied now, at once: under
		// TCG each pod takes tens of seconds to start, and they start side by
		// side while the checks go one after another.
		k.run(t, ctx, "label", "node", second.ID(), moverLabel+"=yes")
		applyStart := time.Now()
		k.applyAtOnce(t, ctx, []string{deploymentOn(first.ID()), podOn("a", first.ID())}, []string{podOn("b", second.ID()), nodePortService},
			[]string{selfTestJob, mover}, pullPods(reg, digest, first.ID(), second.ID()), volumeWorkloads(second.ID()),
			netpolWorkloads(second.ID()), metricsWorkloads(second.ID()), resizeWorkloads(second.ID()))
		t.Logf("the test's workloads applied in %v", time.Since(applyStart).Round(time.Second))
		t.Log(k.run(t, ctx, "get", "nodes", "-o", "wide"))
	})

	step(t, "node-status", func(t *testing.T) {
		// The node's status names each component's process with its CPU
		// time and memory (NodeManagement.Status, from the node's /proc).
		status := ctl.run(t, "node", "status", "--config", c.OwnerDir(), first.ID())
		t.Log(status)
		if !processListed(status, "root.roleserver.kubernetes.controller.apiserver") || !processListed(status, "root") {
			t.Fatalf("plinthctl node status lists no API server or core process with CPU time and memory:\n%s", status)
		}
		// The controller keeps half its two vCPUs from pods for its control
		// plane (kubeReserved); the worker keeps none.
		for n, want := range map[*launch.ClusterNode]string{first: "1", second: "2"} {
			if got := strings.TrimSpace(k.run(t, ctx, "get", "node", n.ID(), "-o", "jsonpath={.status.allocatable.cpu}")); got != want {
				t.Errorf("%s: allocatable CPU %q, want %q", n.Name, got, want)
			}
		}
	})

	step(t, "deployment", func(t *testing.T) {
		// On the node with every role (as a one-node cluster's): a
		// Deployment runs; logs and exec work; a deleted pod is replaced.
		if _, err := k.tryFor(ctx, 11*time.Minute, "rollout", "status", "deployment/web", "--timeout=10m"); err != nil {
			t.Fatal(err)
		}
		web = strings.TrimSpace(k.run(t, ctx, "get", "pods", "-l", "app=web", "-o", "jsonpath={.items[0].metadata.name}"))
		k.until(t, ctx, 2*time.Minute, "pod logs", func(out string) bool { return strings.Contains(out, "listening on") }, "logs", web)
		if out := k.run(t, ctx, "exec", web, "--", "/testpod", "print", "hello from exec"); !strings.Contains(out, "hello from exec") {
			t.Fatalf("kubectl exec: %q", out)
		}
		// Its process runs under the runtime's default seccomp profile
		// (the kubelet's seccompDefault), though the pod asks for none.
		if out := k.run(t, ctx, "exec", web, "--", "/testpod", "cat", "/proc/1/status"); !regexp.MustCompile(`(?m)^Seccomp:\s+2$`).MatchString(out) {
			t.Errorf("the pod's process does not run under seccomp (want Seccomp: 2 in /proc/1/status):\n%s", out)
		}
		// Its processes have the board's timer slack (10 ms: board/qemu.go),
		// which init gave the core and everything it started inherited; a
		// process left with the kernel's 50000 ns would take its own timer
		// interrupts. (This exec's own, read by itself: reading another's
		// needs CAP_SYS_NICE.)
		if out := strings.TrimSpace(k.run(t, ctx, "exec", web, "--", "/testpod", "cat", "/proc/self/timerslack_ns")); out != "10000000" {
			t.Errorf("a process in the pod has a timer slack of %q ns, want the QEMU board's 10000000", out)
		}
	})

	step(t, "pod-to-pod", func(t *testing.T) {
		t.Log("deployment: rolled out, logs, exec; pods a and b on the two nodes, Service b on NodePort")
		if _, err := k.wait(ctx, 10*time.Minute, "Ready", "pod/a", "pod/b"); err != nil {
			t.Fatal(err)
		}
		// Across nodes, by pod IP; restarts is how many times b's container
		// must have restarted (after a node lost its pods).
		reachB = func(t *testing.T, when string, restarts int) (ip string) {
			t.Helper()
			k.untilExplained(t, ctx, 10*time.Minute, "pod b ready "+when, func(out string) bool {
				f := strings.Fields(out)
				if len(f) != 2 {
					return false
				}
				n, err := strconv.Atoi(f[1])
				return err == nil && f[0] == "true" && n >= restarts
			}, func() string { return explainPod(ctx, c, ctl, k, second, "b") },
				"get", "pod", "b", "-o", `jsonpath={.status.containerStatuses[0].ready} {.status.containerStatuses[0].restartCount}`)
			ip = strings.TrimSpace(k.run(t, ctx, "get", "pod", "b", "-o", "jsonpath={.status.podIP}"))
			k.until(t, ctx, 3*time.Minute, "pod a reaches pod b "+when, func(out string) bool { return strings.Contains(out, "hello from b") },
				"exec", "a", "--", "/testpod", "get", "http://"+ip+":8080/")
			return ip
		}
		ipB = reachB(t, "", 0)
	})

	step(t, "self-test-job", func(t *testing.T) {
		t.Log("pod a reached pod b; the self-test job runs")
		// Its pods' logs, each line prefixed with its pod: a pod that started
		// before kube-proxy had the Service's rules fails and the Job retries.
		selfTestLogs := []string{"logs", "-l", "batch.kubernetes.io/job-name=selftest", "--prefix"}
		if _, err := k.wait(ctx, 10*time.Minute, "complete", "job/selftest"); err != nil {
			logs, _ := k.try(ctx, selfTestLogs...)
			t.Fatalf("self-test job: %v\n%s", err, logs)
		}
		logs, err := k.try(ctx, selfTestLogs...)
		t.Logf("self-test job complete; its pods' logs (%v):\n%s", err, logs)
	})

	// The next checks wait on pods and controllers of their own, much of
	// it latency (a pod's stop, a volume's release, the autoscaler's
	// scrapes and decisions, a new namespace's service account): side by
	// side.
	step(t, "checks", func(t *testing.T) {
		t.Run("attack", func(t *testing.T) {
			t.Parallel()
			attackNode(t, ctx, k)
			attackAsTenants(t, ctx, k, nodeIP(t, ctx, k, first))
			checkEtcHosts := attackEtcHosts(t, ctx, k, first.ID(), second.ID())
			attackTmpLink(t, ctx, k, first.ID())
			checkEtcHosts()
		})
		t.Run("metrics", func(t *testing.T) {
			t.Parallel()
			checkMetrics(t, ctx, k, func() string {
				return strings.Join(logLines(ctx, c, ctl, first, "controller.metrics-server", 4, "scrape", "Skipping", "rror"), "\n")
			}, first.ID(), second.ID())
		})
		t.Run("pulls", func(t *testing.T) { t.Parallel(); checkPulls(t, ctx, k, reg, first.ID()) })
		t.Run("volumes", func(t *testing.T) { t.Parallel(); checkVolumes(t, ctx, c, ctl, k, second) })
		t.Run("networkpolicy", func(t *testing.T) { t.Parallel(); checkNetworkPolicy(t, ctx, k) })
		t.Run("resize", func(t *testing.T) { t.Parallel(); checkResize(t, ctx, k) })
	})

	step(t, "nodeport-from-host", func(t *testing.T) {
		// NodePort from the host, through the harness's forward to the first
		// node (the pod is on the second: kube-proxy forwards it there).
		url := "http://" + c.NodePortEndpoint(first) + "/"
		deadline := time.Now().Add(5 * time.Minute)
		for {
			body, err := httpGet(ctx, url)
			if err == nil && strings.Contains(body, "hello from b") {
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("NodePort %s from the host: %q, %v", url, body, err)
			}
			time.Sleep(3 * time.Second)
		}
	})

	step(t, "clocks", func(t *testing.T) {
		checkClocks(t, ctx, k, first, second)
	})

	step(t, "audit-and-revoke", func(t *testing.T) {
		auditAndRevoke(t, ctx, c, ctl, k, first, web)
	})

	step(t, "replace-deleted-pod", func(t *testing.T) {
		k.run(t, ctx, "delete", "pod", web, "--wait=false")
		k.until(t, ctx, 10*time.Minute, "a new pod replaces the deleted one", func(out string) bool {
			f := strings.Fields(out)
			return len(f) == 2 && f[0] != web && f[1] == "Running"
		}, "get", "pods", "-l", "app=web", "--field-selector=status.phase=Running", "-o", `jsonpath={.items[0].metadata.name} {.items[0].status.phase}`)
	})

	step(t, "remove-worker-role", func(t *testing.T) {
		t.Log("NodePort answers from the host, the owner's certificates revoked, a deleted pod replaced; removing the second node's KubernetesWorker role")
		// Role changes: without KubernetesWorker the second node's kubelet
		// stops and the node goes NotReady (the role comes back below,
		// while its power is cut).
		ctl.run(t, "role", "remove", "--config", c.OwnerDir(), second.ID(), "kubernetes-worker")
		// The node says so itself, at once: not the node lifecycle
		// controller's Unknown after its grace period.
		k.until(t, ctx, 2*time.Minute, second.Name+" reports NotReady", func(out string) bool { return out == "False "+kubernetes.NotReadyReason },
			"get", "node", second.ID(), "-o", `jsonpath={.status.conditions[?(@.type=="Ready")].status} {.status.conditions[?(@.type=="Ready")].reason}`)
		// Its pods stopped with it: nothing would manage them.
		if out, err := k.try(ctx, "exec", "a", "--", "/testpod", "get", "-timeout", "5s", "http://"+ipB+":8080/"); err == nil {
			t.Fatalf("pod b still answers on a node without the KubernetesWorker role: %q", out)
		}
	})

	step(t, "power-cut-role-back", func(t *testing.T) {
		// A power cut while the role is away, which is given back while the
		// node is off (the role given to a running node is how this node got
		// it first): the node boots with it, is Ready, runs its pod again
		// (from the image in its containerd store) and pod a reaches it.
		staged(t)
		t.Log("NotReady, pod b gone, the next image staged; cutting the second node's power, then giving the role back")
		if err := c.KillNode(second); err != nil {
			t.Fatal(err)
		}
		ctl.run(t, "role", "add", "--config", c.OwnerDir(), second.ID(), "kubernetes-worker")
		checkPulledAfterReboot := pulledAfterReboot(t, ctx, k, reg, second.ID())
		if err := c.StartNode(ctx, second); err != nil {
			t.Fatal(err)
		}
		ready(t, second, true, 10*time.Minute)
		reachB(t, "after the power cut", 1)
		// The images came from the node's store this time (imported once per
		// image version), pinned against the kubelet's garbage collection.
		if out := ctl.run(t, "node", "logs", "--config", c.OwnerDir(), "--dn", "root.roleserver.kubernetes.worker.images", second.ID()); !strings.Contains(out, "present "+layout.PauseImage) ||
			!strings.Contains(out, "pinned") || strings.Contains(out, "imported "+layout.PauseImage) {
			t.Errorf("the images after the worker's reboot were not taken from its store, pinned:\n%s", out)
		}
		checkPulledAfterReboot()
		readKept(t, ctx, k, "after the worker's power cut")
	})

	step(t, "update-worker", func(t *testing.T) {
		t.Log("pod b back after the power cut (its update staged across it); activating the update, drained first")
		userImages, userPods := userImagePods(t, next, second.ID())
		updateWorker(t, ctx, c, ctl, k, second, first, next, func(when string) { reachB(t, when, 0) }, userPods...)
		checkUserImages(t, ctx, c, ctl, k, second, userImages)
	})
}

// checkClocks: each node's clock agrees with the host's, minutes after
// its boot, as its kubelet's last renewal of its node lease (every 10 s)
// tells. A guest kernel that calibrated its TSC wrongly under TCG ran
// its clock several times too fast (launch: qemuArgs): leases,
// tokens and certificates all go wrong with it.
func checkClocks(t *testing.T, ctx context.Context, k kubectl, nodes ...*launch.ClusterNode) {
	t.Helper()
	for _, n := range nodes {
		out := strings.TrimSpace(k.run(t, ctx, "get", "lease", "-n", "kube-node-lease", n.ID(), "-o", "jsonpath={.spec.renewTime}"))
		renewed, err := time.Parse(time.RFC3339Nano, out)
		if err != nil {
			t.Errorf("%s: node lease renewed at %q: %v", n.Name, out, err)
			continue
		}
		if skew := time.Until(renewed); skew > time.Minute || skew < -time.Minute {
			t.Errorf("%s's clock is %v off the host's (its node lease renewed at %s)", n.Name, skew.Round(time.Second), out)
		}
	}
}

// attackNode is what a user allowed to create pods tries first against
// the node (the attack a security review found: a privileged pod mounting
// /ephemeral reached the etcd member's socket): in default, Pod
// Security's baseline refuses it; in a namespace labelled privileged,
// the host path policy still refuses the node's state, however the path
// is spelled. Nothing is created.
func attackNode(t *testing.T, ctx context.Context, k kubectl) {
	t.Helper()
	pod := func(ns, path string) string {
		return `apiVersion: v1
kind: Pod
metadata: {name: attacker, namespace: ` + ns + `}
spec:
  containers:
  - name: c
    image: ` + layout.TestImage + `
    imagePullPolicy: Never
    args: [pause]
    securityContext: {privileged: true}
    volumeMounts: [{name: node, mountPath: /node}]
  volumes: [{name: node, hostPath: {path: "` + path + `"}}]
`
	}
	// try creates manifest's pod and returns the API server's refusal.
	// kubectl's own checks are off (--validate=false: no OpenAPI download
	// first, which a busy API server under TCG answered after kubectl's
	// 32 s), and a try the API server did not refuse is tried again, as
	// apply is: the attack is on the server's admission, not its load.
	try := func(manifest string) string {
		t.Helper()
		out, err := k.retried(t, ctx, manifest, func(out string, err error) bool {
			// kubectl's prefix for a refusal the API server returned (an
			// admission's is Forbidden or Invalid); anything else (no
			// answer, a timeout, 429, 5xx) is the load.
			return err == nil || strings.Contains(out, "Error from server (Forbidden)") || strings.Contains(out, "Error from server (Invalid)")
		}, "--request-timeout=60s", "create", "--validate=false", "-f", "-")
		if err == nil {
			t.Errorf("admitted:\n%s\n%s", manifest, out)
		}
		return out
	}
	if out := try(pod("default", "/ephemeral")); !strings.Contains(out, `violates PodSecurity "baseline:latest"`) {
		t.Errorf("a privileged pod mounting /ephemeral in default: %s; want Pod Security's baseline refusal", out)
	}
	// The namespace is created with its label, not labelled after: Pod
	// Security reads namespaces from the API server's informer, which a
	// moment after a label change may still hold the namespace without
	// it (then Pod Security's refusal comes first). One not yet in the
	// informer at all it reads from the API: never stale.
	k.apply(t, ctx, `apiVersion: v1
kind: Namespace
metadata: {name: attack, labels: {pod-security.kubernetes.io/enforce: privileged}}
`)
	// Pods need the namespace's default service account, which the
	// controller manager makes (a while after, on a loaded machine):
	// without it the service account admission refuses them first.
	k.until(t, ctx, 5*time.Minute, "the attack namespace's default service account", func(string) bool { return true },
		"get", "serviceaccount", "default", "-n", "attack", "-o", "name")
	for _, p := range []string{"/ephemeral", "//data", "/var/lib/kubelet", "/"} {
		if out := try(pod("attack", p)); !strings.Contains(out, "plinth-host-paths.static.k8s.io") {
			t.Errorf("a privileged pod mounting %s in a privileged namespace: %s; want the host path policy's refusal", p, out)
		}
	}
}

// auditAndRevoke checks that the owner's Kubernetes credentials are
// attributable and revocable: the controller's audit log (plinthctl node logs
// -audit) holds the exec into pod web, done as a user of the owner's
// own name; after plinthctl cluster kubeconfig --revoke-all the certificate
// kubectl had cached is refused at once, and kubectl (with a new one)
// works again.
func auditAndRevoke(t *testing.T, ctx context.Context, c *launch.Cluster, ctl plinthctl, k kubectl, controller *launch.ClusterNode, web string) {
	t.Helper()
	audit := ctl.run(t, "node", "logs", "--config", c.OwnerDir(), controller.ID(), "--audit")
	found := false
	for _, line := range strings.Split(audit, "\n") {
		found = found || strings.Contains(line, `"subresource":"exec"`) && strings.Contains(line, `"name":"`+web+`"`) &&
			strings.Contains(line, `"username":"plinth-owner:`) && strings.Contains(line, "hello+from+exec")
	}
	if !found {
		t.Errorf("the audit log has no exec into %s by the owner (%d lines)", web, strings.Count(audit, "\n"))
	}

	old := cachedCredential(t, c.OwnerDir())
	get := func() int {
		t.Helper()
		req, _ := http.NewRequestWithContext(ctx, http.MethodGet, "https://"+c.KubernetesAPIEndpoint(controller)+"/api/v1/namespaces/default", nil)
		resp, err := old.Do(req)
		if err != nil {
			t.Fatalf("the API server with the cached owner certificate: %v", err)
		}
		resp.Body.Close()
		return resp.StatusCode
	}
	if code := get(); code != http.StatusOK {
		t.Fatalf("the cached owner certificate before the revocation: %d", code)
	}
	ctl.run(t, "cluster", "kubeconfig", "--config", c.OwnerDir(), "--revoke-all")
	deadline := time.Now().Add(time.Minute)
	for code := get(); code != http.StatusForbidden; code = get() {
		if time.Now().After(deadline) {
			t.Fatalf("the revoked owner certificate still gets %d a minute after the revocation", code)
		}
		time.Sleep(time.Second)
	}
	k.until(t, ctx, 2*time.Minute, "kubectl with a new certificate after the revocation", func(string) bool { return true }, "get", "nodes")
}

// cachedCredential is an HTTP client with the owner's Kubernetes
// certificate that kubectl's credential plugin cached in dir.
func cachedCredential(t *testing.T, dir string) *http.Client {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(dir, "kubernetes-credential.json"))
	if err != nil {
		t.Fatal(err)
	}
	var cred struct {
		Status struct{ ClientCertificateData, ClientKeyData string } `json:"status"`
	}
	if err := json.Unmarshal(b, &cred); err != nil {
		t.Fatal(err)
	}
	pair, err := tls.X509KeyPair([]byte(cred.Status.ClientCertificateData), []byte(cred.Status.ClientKeyData))
	if err != nil {
		t.Fatal(err)
	}
	// Only the client certificate matters here: the server is the
	// harness's forward of the node's API server.
	return &http.Client{Timeout: 20 * time.Second, Transport: &http.Transport{TLSClientConfig: &tls.Config{
		Certificates: []tls.Certificate{pair}, InsecureSkipVerify: true}}}
}

// stageUpdate starts `plinthctl node update NODE --stage` of n to next
// (written, checked, sealed for; not booted) and returns a
// function that waits for it and checks it is staged. The install takes
// ~1 min under TCG beside a busy worker: TestKubernetesTwoNodes tests
// pods meanwhile, and a staged update survives the power cut that
// follows (TestUpdate's), so the worker's update is only its reboot.
func stageUpdate(t *testing.T, ctx context.Context, c *launch.Cluster, ctl plinthctl, n *launch.ClusterNode, next *launch.Image) (wait func(t *testing.T)) {
	t.Helper()
	type result struct {
		out string
		err error
	}
	done := make(chan result, 1)
	go func() {
		out, err := ctl.output(ctx, "node", "update", "--config", c.OwnerDir(), n.ID(), "--image", next.Dir, "--stage")
		done <- result{out, err}
	}()
	return func(t *testing.T) {
		t.Helper()
		r := <-done
		t.Logf("plinthctl node update --stage %s:\n%s", n.Name, r.out)
		if r.err != nil {
			t.Fatalf("staging the worker's update: %v", r.err)
		}
		if _, err := c.WaitNode(ctx, n, "staged", func(r *clusterpb.Node) bool {
			p := r.GetStatus().GetSoftware().GetPending()
			return p.GetPhase() == "staged" && p.GetVersion() == next.Manifest.Version
		}); err != nil {
			t.Fatal(err)
		}
	}
}

// updateWorker activates the update of Kubernetes worker n of c to next
// that stageUpdate staged, with `plinthctl node update NODE --activate` draining it
// through other's API server, and checks what an operator expects of a
// worker's update: its pods are evicted before it reboots (pod b is
// gone; the mover Deployment's pod, applied with the test's other
// workloads, ran on n, which it preferred, and moves to other, which it
// prefers from now on), it comes
// back on the new version in slot b, its Kubernetes node Ready and
// uncordoned: a new pod b is scheduled to it and answers (reachB), applied
// with the manifests after (pods the caller checks on the updated node).
func updateWorker(t *testing.T, ctx context.Context, c *launch.Cluster, ctl plinthctl, k kubectl, n, other *launch.ClusterNode, next *launch.Image, reachB func(when string), after ...string) {
	t.Helper()
	// Where the mover's running pods are.
	moverNodes := []string{"get", "pods", "-l", "app=mover", "--field-selector=status.phase=Running", "-o", "jsonpath={.items[*].spec.nodeName}"}
	if _, err := k.tryFor(ctx, 11*time.Minute, "rollout", "status", "deployment/mover", "--timeout=10m"); err != nil {
		t.Fatal(err)
	}
	if got := k.run(t, ctx, moverNodes...); got != n.ID() {
		t.Fatalf("the mover pod runs on %q, not on %s, which it prefers", got, n.Name)
	}
	// From now on it prefers other; what moves it is the drain.
	k.run(t, ctx, "label", "node", other.ID(), moverLabel+"=yes")
	k.run(t, ctx, "label", "node", n.ID(), moverLabel+"-")
	cmd := []string{"node", "update", "--config", c.OwnerDir(), n.ID(), "--activate", "--version", next.Manifest.Version, "--kube-server", c.KubernetesAPIEndpoint(other)}
	out, err := ctl.output(ctx, cmd...)
	t.Logf("plinthctl %s:\n%s", strings.Join(cmd, " "), out)
	if err != nil {
		t.Fatalf("the update of the worker failed: %v", err)
	}
	m := regexp.MustCompile(`cordoned, (\d+) pods evicted`).FindStringSubmatch(out)
	if m == nil {
		t.Fatal("plinthctl does not say it cordoned and drained the worker")
	}
	if evicted, _ := strconv.Atoi(m[1]); evicted < 2 {
		t.Errorf("plinthctl evicted %d pods from the worker; pod b and the mover pod ran there", evicted)
	}
	for _, want := range []string{"Kubernetes node Ready", "uncordoned"} {
		if !strings.Contains(out, want) {
			t.Errorf("plinthctl's output does not say %q", want)
		}
	}
	rec := nodeRecord(t, ctx, c, n.ID())
	sw := rec.GetStatus().GetSoftware()
	if rec.GetStatus().GetVersion() != next.Manifest.Version || sw.GetSlot() != "b" || sw.GetPending() != nil || sw.GetLastFailed() != nil {
		t.Errorf("%s after its update: version %s, software %v (want %s in slot b)", n.Name, rec.GetStatus().GetVersion(), sw, next.Manifest.Version)
	}
	if got := k.run(t, ctx, "get", "node", n.ID(), "-o", "jsonpath={.spec.unschedulable}"); got != "" && got != "false" {
		t.Errorf("%s is still cordoned after its update: unschedulable=%q", n.Name, got)
	}
	if got := k.run(t, ctx, "get", "pods", "-l", "app=b", "-o", "name"); strings.TrimSpace(got) != "" {
		t.Errorf("pod b was not evicted by the drain: %q", got)
	}
	k.until(t, ctx, 5*time.Minute, "the mover pod runs on "+other.Name, func(out string) bool { return out == other.ID() }, moverNodes...)
	k.applyAtOnce(t, ctx, append([]string{podOn("b", n.ID())}, after...))
	reachB("after the update")
}

// processListed says whether plinthctl node status's table has a row for dn
// with a PID, CPU time above zero and a resident size.
func processListed(table, dn string) bool {
	for _, line := range strings.Split(table, "\n") {
		f := strings.Fields(line)
		// RUNNABLE STATE RESTARTS PID CPU RSS PEAK-RSS LAST-ERROR
		if len(f) < 8 || f[0] != dn {
			continue
		}
		pid, err := strconv.Atoi(f[3])
		cpu, err2 := strconv.ParseFloat(strings.TrimSuffix(f[4], "s"), 64)
		return err == nil && err2 == nil && pid > 0 && cpu > 0 && strings.HasSuffix(f[5], "MiB") && f[5] != "0.0MiB"
	}
	return false
}

// httpGet fetches url from the host.
func httpGet(ctx context.Context, url string) (string, error) {
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return "", err
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return "", err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	return string(b), err
}
