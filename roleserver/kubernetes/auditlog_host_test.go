//go:build built

package kubernetes

import (
	"context"
	"crypto/tls"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"google.golang.org/protobuf/proto"

	"plinth.dev/plinth/api/clusterpb"
	"plinth.dev/plinth/platform/event"
	"plinth.dev/plinth/platform/event/memory"
	"plinth.dev/plinth/roleserver/kubernetes/auditlog"
	"plinth.dev/plinth/roleserver/localstorage"
	"plinth.dev/plinth/roleserver/owner"
)

// checkAuditPersists floods the real API server's audit log as a tenant
// and an anonymous caller would after the owner's exec into a pod: 5000
// reads by the tenant and 5000 unauthenticated requests (more than the
// log tree's stream keeps, so a ring would have lost the exec), then
// restarts the control plane (a new cluster policy: the API server runs
// again, the store is opened again). The exec, with its command, is
// still in the store on the data volume, and in the reads' and the
// anonymous callers' classes are theirs.
func checkAuditPersists(t *testing.T, ctx context.Context, kapi *owner.KubeAPI, root *localstorage.Root, status *memory.Value[*Status],
	policy *memory.Value[*clusterpb.ClusterConfiguration]) {
	t.Helper()
	const marker = "audit-marker-4711"
	h := http.Header{"Impersonate-User": {"plinth-owner:audit"}, "Impersonate-Group": {"system:authenticated", "system:masters"}}
	if code, b, _, err := apiRequestWith(ctx, kapi, "POST", "/api/v1/namespaces/tenant/pods", `{"apiVersion":"v1","kind":"Pod",
		"metadata":{"name":"audited"},"spec":{"nodeName":"plinth-test","containers":[{"name":"c","image":"plinth.dev/testpod:v1"}]}}`, h); err != nil || code != http.StatusCreated {
		t.Fatalf("creating the pod to exec into: %d %s %v", code, b, err)
	}
	// Not upgraded to a stream: refused, and audited all the same.
	if code, _, _, err := apiRequestWith(ctx, kapi, "POST", "/api/v1/namespaces/tenant/pods/audited/exec?command=echo&command="+marker+"&stdout=true", "", h); err != nil || code < 400 {
		t.Fatalf("exec: %d, %v", code, err)
	}
	anonymous := &http.Client{Timeout: 20 * time.Second, Transport: &http.Transport{TLSClientConfig: &tls.Config{InsecureSkipVerify: true}, MaxIdleConnsPerHost: 8}}
	var wg sync.WaitGroup
	for w := range 8 {
		wg.Go(func() {
			for i := w; i < 5000; i += 8 {
				apiRequestWith(ctx, kapi, "GET", "/api/v1/namespaces/tenant/configmaps", "", http.Header{"Impersonate-User": {"tenant"}})
				req, _ := http.NewRequestWithContext(ctx, "GET", kapi.Server+"/api/v1/namespaces/tenant/secrets", nil)
				if resp, err := anonymous.Do(req); err == nil {
					resp.Body.Close()
				}
			}
		})
	}
	wg.Wait()

	// The control plane restarts with a new admission policy.
	sw := status.Watch()
	defer sw.Close()
	cfg := proto.Clone(get(policy)).(*clusterpb.ClusterConfiguration)
	cfg.Kubernetes.AllowedExternalIps = []string{"192.0.2.0/28"}
	policy.Set(cfg)
	if _, err := sw.Get(ctx, event.Filter(func(s *Status) bool { return s == nil })); err != nil {
		t.Fatalf("the control plane did not restart: %v", err)
	}
	if _, err := sw.Get(ctx, event.Filter(func(s *Status) bool { return s != nil })); err != nil {
		t.Fatalf("the control plane did not serve again: %v", err)
	}
	events, err := auditlog.Read(root.Data.Kubernetes.Audit.Path())
	if err != nil {
		t.Fatal(err)
	}
	var exec, reads, anon int
	for _, e := range events {
		switch {
		case strings.Contains(e.Line, `"subresource":"exec"`) && strings.Contains(e.Line, marker):
			exec++
			if e.Class != auditlog.ClassInteractive || !strings.Contains(e.Line, `"username":"plinth-owner:audit"`) {
				t.Errorf("the exec event, class %s: %s", e.Class, e.Line)
			}
		case e.Class == auditlog.ClassReads && strings.Contains(e.Line, `"username":"tenant"`):
			reads++
		case e.Class == auditlog.ClassAnonymous:
			anon++
		}
	}
	// An exec is long-running: audited as its response starts and ends.
	if exec < 1 || reads < 4000 || anon < 4000 {
		t.Errorf("after 5000 reads, 5000 anonymous requests and a restart the store holds %d exec events, %d reads, %d anonymous requests", exec, reads, anon)
	}
}

// get is v's value now.
func get[T any](v *memory.Value[T]) T {
	w := v.Watch()
	defer w.Close()
	x, _ := w.Get(context.Background())
	return x
}
