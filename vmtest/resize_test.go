//go:build built

package vmtest

import (
	"context"
	"strings"
	"testing"
	"time"
)

// resizeWorkloads is the in-place resize check's pod: podOn's, on the
// worker, with a CPU limit of 200m (cgroup v2 cpu.max "20000 100000").
func resizeWorkloads(worker string) []string {
	return []string{podOn("resize", worker) + "    resources: {requests: {cpu: 100m}, limits: {cpu: 200m}}\n"}
}

// checkResize: the pod's CPU limit raised in place (its resize
// subresource, as the conformance suite's InPlace Resize specs do)
// reaches its container's cgroup, and the container is not restarted.
// The kubelet asks containerd, whose shim runs the OCI runtime's `update
// --resources -`: crun reads the resources from /dev/stdin, which a
// node's /dev lacked until init made the compulsory links
// (mount.DevLinks), and the resize failed.
func checkResize(t *testing.T, ctx context.Context, k kubectl) {
	if _, err := k.wait(ctx, 10*time.Minute, "Ready", "pod/resize"); err != nil {
		t.Fatal(err)
	}
	cpuMax := []string{"exec", "resize", "--", "/testpod", "cat", "/sys/fs/cgroup/cpu.max"}
	if got := strings.TrimSpace(k.run(t, ctx, cpuMax...)); got != "20000 100000" {
		t.Fatalf("the container's cpu.max before the resize: %q, want 20000 100000 (a 200m limit)", got)
	}
	k.run(t, ctx, "patch", "pod", "resize", "--subresource", "resize", "--type", "merge",
		"-p", `{"spec":{"containers":[{"name":"web","resources":{"limits":{"cpu":"300m"}}}]}}`)
	k.untilExplained(t, ctx, 3*time.Minute, "the container's cpu.max after the resize to 300m",
		func(out string) bool { return strings.TrimSpace(out) == "30000 100000" },
		func() string {
			out, _ := k.try(ctx, "get", "pod", "resize", "-o", "jsonpath={.status.conditions}")
			return "the pod's conditions (a failed resize is PodResizeInProgress with reason Error): " + out
		}, cpuMax...)
	if n := strings.TrimSpace(k.run(t, ctx, "get", "pod", "resize", "-o", "jsonpath={.status.containerStatuses[0].restartCount}")); n != "0" {
		t.Errorf("the container restarted %s times: the resize was not in place", n)
	}
}
