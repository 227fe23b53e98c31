//go:build built

package vmtest

import (
	"context"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"plinth.dev/plinth/platform/layout"
)

// netpolWorkloads are the NetworkPolicy check's workloads: in namespace
// guarded, a pod on the worker serving on 8080 and 8081 (two
// containers), and a Service of its 8081.
func netpolWorkloads(worker string) []string {
	return []string{`apiVersion: v1
kind: Namespace
metadata: {name: guarded}
---
apiVersion: v1
kind: Pod
metadata: {name: guarded, namespace: guarded, labels: {app: guarded}}
spec:
  nodeSelector: {kubernetes.io/hostname: ` + worker + `}
  ` + strings.ReplaceAll(outlastOutages, "\n", "\n  ") + `
  containers:
  - {name: a, image: ` + layout.TestImage + `, imagePullPolicy: Never, args: [serve, -port, "8080"]}
  - {name: b, image: ` + layout.TestImage + `, imagePullPolicy: Never, args: [serve, -port, "8081"]}
---
apiVersion: v1
kind: Service
metadata: {name: guarded, namespace: guarded}
spec:
  selector: {app: guarded}
  ports: [{port: 80, targetPort: 8081}]
`}
}

// The policies of the check: every ingress of namespace guarded denied,
// then pod a of namespace default let in on 8080 alone, then every
// egress denied.
const (
	denyGuarded = `apiVersion: networking.k8s.io/v1
kind: NetworkPolicy
metadata: {name: deny, namespace: guarded}
spec:
  podSelector: {}
  policyTypes: [Ingress]
`
	allowA8080 = `apiVersion: networking.k8s.io/v1
kind: NetworkPolicy
metadata: {name: allow-a, namespace: guarded}
spec:
  podSelector: {matchLabels: {app: guarded}}
  ingress:
  - from:
    - namespaceSelector: {matchLabels: {kubernetes.io/metadata.name: default}}
      podSelector: {matchLabels: {app: a}}
    ports: [{protocol: TCP, port: 8080}]
`
	denyGuardedEgress = `apiVersion: networking.k8s.io/v1
kind: NetworkPolicy
metadata: {name: deny-egress, namespace: guarded}
spec:
  podSelector: {}
  policyTypes: [Egress]
`
)

// checkNetworkPolicy: from pod a on the controller, the guarded pod on
// the worker answers on both ports and through its Service's VIP, as it
// does on 8080 to pod b on its own node; and the guarded pod reaches pod
// a. A default deny of ingress stops the four connections to it (not
// its own to a); an allow rule for a on 8080 opens that port to a alone
// (8081, the VIP to it, and b on the same node stay closed); a default
// deny of egress then stops the guarded pod's connection to a, while a's
// allowed one to it stays open.
func checkNetworkPolicy(t *testing.T, ctx context.Context, k kubectl) {
	t.Helper()
	if out, err := k.wait(ctx, 10*time.Minute, "Ready", "-n", "guarded", "pod/guarded"); err != nil {
		t.Fatalf("the guarded pod not Ready: %v\n%s", err, out)
	}
	ip := strings.TrimSpace(k.run(t, ctx, "get", "-n", "guarded", "pod", "guarded", "-o", "jsonpath={.status.podIP}"))
	vip := strings.TrimSpace(k.run(t, ctx, "get", "-n", "guarded", "service", "guarded", "-o", "jsonpath={.spec.clusterIP}"))
	ipA := strings.TrimSpace(k.run(t, ctx, "get", "pod", "a", "-o", "jsonpath={.status.podIP}"))
	// A connection: kubectl exec's arguments for the client, the URL,
	// and what the server answers.
	type conn struct {
		from      []string
		url, want string
	}
	fromA, fromB, fromGuarded := []string{"a"}, []string{"b"}, []string{"-n", "guarded", "guarded", "-c", "a"}
	conns := map[string]conn{
		"a to 8080":             {fromA, "http://" + ip + ":8080/", "hello from guarded"},
		"a to 8081":             {fromA, "http://" + ip + ":8081/", "hello from guarded"},
		"a to the VIP":          {fromA, "http://" + vip + ":80/", "hello from guarded"},
		"b (same node) to 8080": {fromB, "http://" + ip + ":8080/", "hello from guarded"},
		"guarded to a":          {fromGuarded, "http://" + ipA + ":8080/", "hello from a"},
	}
	reaches := func(c conn) bool {
		out, err := k.try(ctx, append(append(append([]string{"exec"}, c.from...), "--", "/testpod", "get", "-timeout", "4s"), c.url)...)
		return err == nil && strings.Contains(out, c.want)
	}
	expect := func(when string, closed ...string) {
		t.Helper()
		start := time.Now()
		deadline := start.Add(3 * time.Minute)
		for tries := 1; ; tries++ {
			// All at once: a closed one takes its whole timeout.
			var mu sync.Mutex
			var wg sync.WaitGroup
			var wrong []string
			for name, c := range conns {
				wg.Go(func() {
					if reaches(c) != !slices.Contains(closed, name) {
						mu.Lock()
						wrong = append(wrong, name)
						mu.Unlock()
					}
				})
			}
			wg.Wait()
			if len(wrong) == 0 {
				t.Logf("network policy: %s: as expected after %v (%d tries)", when, time.Since(start).Round(time.Second), tries)
				return
			}
			if time.Now().After(deadline) {
				t.Fatalf("%s: connections %v are not as they should be (closed: only %v)", when, wrong, closed)
			}
			time.Sleep(2 * time.Second)
		}
	}
	expect("without a policy")
	k.apply(t, ctx, denyGuarded)
	expect("with a default deny of ingress", "a to 8080", "a to 8081", "a to the VIP", "b (same node) to 8080")
	k.apply(t, ctx, allowA8080)
	expect("with a allowed on 8080", "a to 8081", "a to the VIP", "b (same node) to 8080")
	k.apply(t, ctx, denyGuardedEgress)
	expect("with a default deny of egress too", "a to 8081", "a to the VIP", "b (same node) to 8080", "guarded to a")
	t.Log("network policy: default denies stopped connections to the guarded pod across nodes and on its node, by pod IP and Service VIP, and from it; an allow rule opened 8080 to pod a alone")
	k.run(t, ctx, "delete", "namespace", "guarded", "--wait=false")
}
