package vmtest

import (
	"context"
	"strings"
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
// then pod a of namespace default let in on 8080 alone.
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
)

// checkNetworkPolicy: from pod a on the controller, the guarded pod on
// the worker answers on both ports and through its Service's VIP; a
// default deny stops all three; an allow rule for a on 8080 opens that
// port alone (8081, and the VIP to it, stay closed).
func checkNetworkPolicy(t *testing.T, ctx context.Context, k kubectl) {
	t.Helper()
	if out, err := k.wait(ctx, 10*time.Minute, "Ready", "-n", "guarded", "pod/guarded"); err != nil {
		t.Fatalf("the guarded pod not Ready: %v\n%s", err, out)
	}
	ip := strings.TrimSpace(k.run(t, ctx, "get", "-n", "guarded", "pod", "guarded", "-o", "jsonpath={.status.podIP}"))
	vip := strings.TrimSpace(k.run(t, ctx, "get", "-n", "guarded", "service", "guarded", "-o", "jsonpath={.spec.clusterIP}"))
	urls := map[string]string{"8080": "http://" + ip + ":8080/", "8081": "http://" + ip + ":8081/", "the VIP": "http://" + vip + ":80/"}
	reaches := func(url string) bool {
		out, err := k.try(ctx, "exec", "a", "--", "/testpod", "get", "-timeout", "4s", url)
		return err == nil && strings.Contains(out, "hello from guarded")
	}
	expect := func(when string, want map[string]bool) {
		t.Helper()
		for deadline := time.Now().Add(3 * time.Minute); ; time.Sleep(2 * time.Second) {
			var wrong []string
			for name, open := range want {
				if reaches(urls[name]) != open {
					wrong = append(wrong, name)
				}
			}
			if len(wrong) == 0 {
				return
			}
			if time.Now().After(deadline) {
				t.Fatalf("%s: pod a's connections to %v are not as %v", when, wrong, want)
			}
		}
	}
	expect("without a policy", map[string]bool{"8080": true, "8081": true, "the VIP": true})
	k.apply(t, ctx, denyGuarded)
	expect("with a default deny", map[string]bool{"8080": false, "8081": false, "the VIP": false})
	k.apply(t, ctx, allowA8080)
	expect("with a allowed on 8080", map[string]bool{"8080": true, "8081": false, "the VIP": false})
	t.Log("network policy: a default deny stopped pod a's connections across nodes, by pod IP and Service VIP; an allow rule opened 8080 alone")
	k.run(t, ctx, "delete", "namespace", "guarded", "--wait=false")
}
