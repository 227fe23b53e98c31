//go:build built

package vmtest

import (
	"context"
	"regexp"
	"strings"
	"testing"
	"time"

	"plinth.dev/plinth/platform/layout"
)

// metricsWorkloads are the metrics check's: on the worker, a Deployment
// of one pod keeping a CPU busy (limited to 20m, asking for 10m: twice
// what it asks, four times the autoscaler's target, and little of a TCG
// host's CPU, which the two nodes share), and a HorizontalPodAutoscaler
// keeping its pods at half the CPU they ask for, up to two.
func metricsWorkloads(worker string) []string {
	return []string{`apiVersion: apps/v1
kind: Deployment
metadata: {name: busy}
spec:
  replicas: 1
  selector: {matchLabels: {app: busy}}
  template:
    metadata: {labels: {app: busy}}
    spec:
      nodeSelector: {kubernetes.io/hostname: ` + worker + `}
      containers:
      - name: busy
        image: ` + layout.TestImage + `
        imagePullPolicy: Never
        args: [spin]
        resources: {requests: {cpu: 10m}, limits: {cpu: 20m}}
---
apiVersion: autoscaling/v2
kind: HorizontalPodAutoscaler
metadata: {name: busy}
spec:
  scaleTargetRef: {apiVersion: apps/v1, kind: Deployment, name: busy}
  minReplicas: 1
  maxReplicas: 2
  metrics:
  - type: Resource
    resource: {name: cpu, target: {type: Utilization, averageUtilization: 50}}
`}
}

// checkMetrics: kubectl top nodes names every node with its CPU and
// memory, kubectl top pods the busy pod's, and the autoscaler, reading
// the same API, scales the busy Deployment to two pods. The Deployment
// goes after: its load would slow the rest of the test. A failure says
// what explain finds (the metrics server's complaints).
func checkMetrics(t *testing.T, ctx context.Context, k kubectl, explain func() string, nodes ...string) {
	t.Helper()
	usage := regexp.MustCompile(`^\d+m\s+\d+%\s+\d+Mi\s+\d+%$`)
	k.untilExplained(t, ctx, 5*time.Minute, "kubectl top nodes names every node", func(out string) bool {
		for _, n := range nodes {
			found := false
			for _, line := range strings.Split(out, "\n") {
				if f := strings.SplitN(strings.TrimSpace(line), " ", 2); len(f) == 2 && f[0] == n && usage.MatchString(strings.TrimSpace(f[1])) {
					found = true
				}
			}
			if !found {
				return false
			}
		}
		return true
	}, explain, "top", "nodes")
	k.untilExplained(t, ctx, 5*time.Minute, "kubectl top pods shows the busy pod using CPU", func(out string) bool {
		return regexp.MustCompile(`(?m)^busy-\S+\s+[1-9]\d*m\s+\d+Mi\s*$`).MatchString(out)
	}, explain, "top", "pods", "-l", "app=busy")
	out := k.untilExplained(t, ctx, 5*time.Minute, "the autoscaler scales the busy Deployment to 2", func(out string) bool {
		return strings.HasSuffix(out, " 2 2")
	}, explain, "get", "hpa", "busy", "-o", `jsonpath={.status.currentMetrics[0].resource.current.averageUtilization} {.status.desiredReplicas} {.status.currentReplicas}`)
	t.Logf("the autoscaler: CPU at %s%% of the request, two pods", strings.Fields(out)[0])
	if got := strings.TrimSpace(k.run(t, ctx, "get", "deployment", "busy", "-o", "jsonpath={.spec.replicas}")); got != "2" {
		t.Errorf("the busy Deployment has %s replicas, want the autoscaler's 2", got)
	}
	k.run(t, ctx, "delete", "hpa/busy", "deployment/busy", "--wait=false")
}
