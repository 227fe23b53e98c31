package main

import (
	"context"
	"fmt"
	"maps"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"time"

	"plinth.dev/plinth/launch"
	"plinth.dev/plinth/platform/layout"
)

// apiServingRE is the controller's line once its API server serves.
var apiServingRE = regexp.MustCompile(`^(\S+) I \S+: Kubernetes API server serving`)

// benchKubernetes launches a one-node cluster with Kubernetes (controller
// and worker on the bootstrap node) and times power-on to the API
// server serving, to the node Ready, and a pod's creation to Running
// (the test image, from the node's containerd store). It then reports
// what the node's processes used (plinthctl node status's numbers): CPU
// time and peak resident memory of the core (role server, etcd
// embedded) and of each Kubernetes process; and last, a reboot to the
// API server serving again (its objects exist then).
func benchKubernetes(ctx context.Context, img *launch.Image, binDir, work string, add addFunc) error {
	b := &kubeBench{plinthctl: filepath.Join(binDir, "plinthctl"), kubectlBin: filepath.Join(binDir, "kubectl"), add: add}
	for _, bin := range []string{b.kubectlBin, b.plinthctl} {
		if _, err := os.Stat(bin); err != nil {
			return fmt.Errorf("%w (make bench builds it)", err)
		}
	}
	dir := filepath.Join(work, "kubernetes")
	b.kubeconfig = filepath.Join(dir, "kubeconfig")
	cons := &consoleClock{boots: map[string][]*stampedBoot{}}
	c, err := launch.LaunchCluster(ctx, launch.ClusterOptions{
		Nodes: 1, Image: img, Dir: dir, DiskSizeBytes: 4 << 30, Kubernetes: true, Progress: os.Stderr, Console: cons.writer,
	})
	if err != nil {
		return err
	}
	defer c.Close()
	node := c.Nodes()[0]
	if err := b.serving(ctx, c, node); err != nil {
		return err
	}
	if err := b.ready(ctx, node, cons); err != nil {
		return err
	}
	if err := b.podRunning(ctx); err != nil {
		return err
	}
	if err := b.usage(ctx, c, node); err != nil {
		return err
	}
	if err := b.idle(ctx, c, node, time.Minute); err != nil {
		return err
	}
	return benchKubernetesReboot(ctx, c, node, cons, add)
}

// kubeBench is one run of benchKubernetes: the project's plinthctl and
// kubectl, and the kubeconfig plinthctl writes.
type kubeBench struct {
	plinthctl, kubectlBin, kubeconfig string
	add                               addFunc
}

// serving waits (plinthctl cluster kubeconfig --wait) for the API server
// to serve and reports what the API server and the core had used by then
// (about: kubeconfig --wait polls), beside the calibration's CPU time at
// its /readyz 200. The times come from the console and kubectl, not from
// this.
func (b *kubeBench) serving(ctx context.Context, c *launch.Cluster, node *launch.ClusterNode) error {
	if out, err := exec.CommandContext(ctx, b.plinthctl, "cluster", "kubeconfig", "--config", c.OwnerDir(),
		"--server", "https://"+c.KubernetesAPIEndpoint(node), "--wait", "20m", "--file", b.kubeconfig).CombinedOutput(); err != nil {
		return fmt.Errorf("plinthctl cluster kubeconfig: %v: %s", err, out)
	}
	if st, err := c.Client().NodeStatus(ctx, node.ID()); err == nil {
		for _, r := range st.GetRunnables() {
			if p := r.GetProcess(); p != nil && (r.GetDn() == "root" || r.GetDn() == "root.roleserver.kubernetes.controller.apiserver") {
				b.add("kubernetes_cpu_at_serving_"+processName(r.GetDn())+"_seconds", p.GetCpuSeconds(), "s", "CPU time of "+r.GetDn()+"'s process when kubeconfig --wait saw the API server serve")
			}
		}
	}
	return nil
}

// kubectl runs the project's kubectl with the bench's kubeconfig.
func (b *kubeBench) kubectl(ctx context.Context, timeout time.Duration, args ...string) (string, error) {
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	out, err := exec.CommandContext(ctx, b.kubectlBin, append([]string{"--kubeconfig", b.kubeconfig, "--request-timeout=30s"}, args...)...).CombinedOutput()
	if err != nil {
		return "", fmt.Errorf("kubectl %s: %v: %s", strings.Join(args, " "), err, out)
	}
	return string(out), nil
}

// poll checks ok every second until it holds, and returns when it did.
func poll(what string, timeout time.Duration, ok func() bool) (time.Time, error) {
	deadline := time.Now().Add(timeout)
	for !ok() {
		if time.Now().After(deadline) {
			return time.Time{}, fmt.Errorf("%s: not within %v", what, timeout)
		}
		time.Sleep(time.Second)
	}
	return time.Now(), nil
}

// ready times power-on to the API server serving (its console line) and
// to the Node's Ready condition.
func (b *kubeBench) ready(ctx context.Context, node *launch.ClusterNode, cons *consoleClock) error {
	fmt.Fprintln(os.Stderr, "kubernetes: waiting for the node to be Ready")
	readyAt, err := poll("node Ready", 20*time.Minute, func() bool {
		out, err := b.kubectl(ctx, time.Minute, "get", "node", node.ID(), "-o", `jsonpath={.status.conditions[?(@.type=="Ready")].status}`)
		return err == nil && out == "True"
	})
	if err != nil {
		return err
	}
	servingAt, servingUp, err := cons.event(node.Name, apiServingRE)
	if err != nil {
		return err
	}
	launched := node.Times().Launched
	accel := accelName()
	b.add("kubernetes_api_serving_wall_seconds", servingAt.Sub(launched).Seconds(), "s", accel+", launch to 'Kubernetes API server serving' on the console (readyz passed)")
	b.add("kubernetes_api_serving_guest_seconds", servingUp, "s", "guest uptime at that line")
	b.add("kubernetes_node_ready_wall_seconds", readyAt.Sub(launched).Seconds(), "s", "launch to the Node's Ready condition True (kubectl, polled every second)")
	return nil
}

// podRunning times a pod of the test image (from the node's store) from
// kubectl create to Running.
func (b *kubeBench) podRunning(ctx context.Context) error {
	pod := `{"apiVersion":"v1","kind":"Pod","metadata":{"name":"bench"},"spec":{"containers":[{"name":"c","image":"` +
		layout.TestImage + `","imagePullPolicy":"Never","args":["serve"]}]}}`
	created := time.Now()
	cmd := exec.CommandContext(ctx, b.kubectlBin, "--kubeconfig", b.kubeconfig, "create", "-f", "-")
	cmd.Stdin = strings.NewReader(pod)
	if out, err := cmd.CombinedOutput(); err != nil {
		return fmt.Errorf("kubectl create: %v: %s", err, out)
	}
	runningAt, err := poll("pod Running", 10*time.Minute, func() bool {
		out, err := b.kubectl(ctx, time.Minute, "get", "pod", "bench", "-o", "jsonpath={.status.phase}")
		return err == nil && out == "Running"
	})
	if err != nil {
		return err
	}
	b.add("kubernetes_pod_running_wall_seconds", runningAt.Sub(created).Seconds(), "s", "kubectl create of a pod of the test image to phase Running (polled every second)")
	return nil
}

// usage reports what the node's processes used (plinthctl node status's
// numbers): CPU time and peak resident memory of the core (role server,
// etcd embedded) and of each Kubernetes process.
func (b *kubeBench) usage(ctx context.Context, c *launch.Cluster, node *launch.ClusterNode) error {
	st, err := c.Client().NodeStatus(ctx, node.ID())
	if err != nil {
		return err
	}
	var totalCPU, totalPeak float64
	for _, r := range st.GetRunnables() {
		p := r.GetProcess()
		if p == nil {
			continue
		}
		name := processName(r.GetDn())
		b.add("kubernetes_cpu_"+name+"_seconds", p.GetCpuSeconds(), "s", "CPU time of "+r.GetDn()+"'s process, a pod after Ready")
		b.add("kubernetes_peak_rss_"+name+"_mib", float64(p.GetPeakRssBytes())/(1<<20), "MiB", "peak resident memory (VmHWM) of "+r.GetDn()+"'s process")
		totalCPU += p.GetCpuSeconds()
		totalPeak += float64(p.GetPeakRssBytes()) / (1 << 20)
	}
	b.add("kubernetes_cpu_total_seconds", totalCPU, "s", "sum of the above (not counting pods, shims or the kernel)")
	b.add("kubernetes_peak_rss_sum_mib", totalPeak, "MiB", "sum of the processes' peaks (an upper bound of their joint peak)")
	return nil
}

// idle reports what the node costs at rest, over window, a pod
// running and nothing asked of it: each process's CPU (cores: CPU
// seconds a second, from plinthctl node status's numbers) and QEMU's on
// the host. Under TCG every minute a Kubernetes VM test waits costs that
// much of the machine the tests share.
func (b *kubeBench) idle(ctx context.Context, c *launch.Cluster, node *launch.ClusterNode, window time.Duration) error {
	fmt.Fprintf(os.Stderr, "kubernetes: at rest for %v\n", window)
	sample := func() (map[string]float64, float64, time.Time, error) {
		st, err := c.Client().NodeStatus(ctx, node.ID())
		if err != nil {
			return nil, 0, time.Time{}, err
		}
		host, err := node.VM().HostCPUSeconds()
		cpu := map[string]float64{}
		for _, r := range st.GetRunnables() {
			if p := r.GetProcess(); p != nil {
				cpu[processName(r.GetDn())] = p.GetCpuSeconds()
			}
		}
		return cpu, host, time.Now(), err
	}
	cpu0, host0, t0, err := sample()
	if err != nil {
		return err
	}
	select {
	case <-time.After(window):
	case <-ctx.Done():
		return ctx.Err()
	}
	cpu1, host1, t1, err := sample()
	if err != nil {
		return err
	}
	secs := t1.Sub(t0).Seconds()
	var total float64
	for _, name := range slices.Sorted(maps.Keys(cpu1)) {
		if before, ok := cpu0[name]; ok {
			b.add("kubernetes_idle_"+name+"_cores", (cpu1[name]-before)/secs, "cores", "CPU of "+name+"'s process at rest (a pod running, no requests)")
			total += (cpu1[name] - before) / secs
		}
	}
	b.add("kubernetes_idle_processes_cores", total, "cores", "sum of the above (not counting pods, shims or the kernel)")
	b.add("kubernetes_idle_qemu_host_cores", (host1-host0)/secs, "cores", "QEMU's CPU on the host meanwhile (TCG: every instruction the guest runs, its kernel's included)")
	return nil
}

// processName is a runnable's DN as a benchmark name part.
func processName(dn string) string {
	name := strings.TrimPrefix(dn, "root.roleserver.kubernetes.")
	if dn == "root" {
		name = "roleserver"
	}
	return strings.NewReplacer(".", "_", "-", "_").Replace(name)
}

// benchKubernetesReboot reboots the node (NodeManagement, a clean
// reboot) and times its next boot to the API server serving: what a
// controller's restart costs once the cluster's objects exist.
func benchKubernetesReboot(ctx context.Context, c *launch.Cluster, node *launch.ClusterNode, cons *consoleClock, add addFunc) error {
	fmt.Fprintln(os.Stderr, "kubernetes: rebooting the node")
	if err := c.RebootNode(ctx, node); err != nil {
		return err
	}
	started := time.Now()
	deadline := started.Add(10 * time.Minute)
	for {
		at, up, err := cons.eventIn(node.Name, 1, apiServingRE)
		if err == nil {
			add("kubernetes_reboot_api_serving_wall_seconds", at.Sub(started).Seconds(), "s", "the next boot's QEMU start (about) to 'Kubernetes API server serving' on its console")
			add("kubernetes_reboot_api_serving_guest_seconds", up, "s", "guest uptime at that line")
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("after the reboot: %w", err)
		}
		time.Sleep(time.Second)
	}
}
