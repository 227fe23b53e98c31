package owner

import (
	"context"
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"
)

// TestCordonAndDrain: against a stand-in for the Kubernetes API (the REST
// calls are the unit here; the API server's own behaviour is Kubernetes'):
// cordon sends a merge patch of spec.unschedulable; drain evicts the pods
// of the node through the Eviction API, leaves DaemonSet and static pods,
// retries an eviction a disruption budget refuses (429), and returns once
// the evicted pods are gone.
func TestCordonAndDrain(t *testing.T) {
	var mu sync.Mutex
	pods := map[string]string{"default/web": "", "default/db": "", "kube-system/ds": "DaemonSet", "kube-system/static": "mirror"}
	refused := false
	var patch string
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		defer mu.Unlock()
		switch {
		case r.Method == http.MethodPatch && r.URL.Path == "/api/v1/nodes/plinth-a":
			b, _ := io.ReadAll(r.Body)
			if r.Header.Get("Content-Type") != "application/merge-patch+json" {
				http.Error(w, "content type", http.StatusUnsupportedMediaType)
				return
			}
			patch = string(b)
			w.Write([]byte(`{}`))
		case r.Method == http.MethodGet && r.URL.Path == "/api/v1/nodes/plinth-a":
			w.Write([]byte(`{"status":{"conditions":[{"type":"MemoryPressure","status":"False"},{"type":"Ready","status":"True","reason":"KubeletReady"}]}}`))
		case r.Method == http.MethodGet && r.URL.Path == "/api/v1/nodes/plinth-new":
			w.Write([]byte(`{"status":{}}`))
		case r.Method == http.MethodGet && r.URL.Path == "/api/v1/pods":
			if r.URL.Query().Get("fieldSelector") != "spec.nodeName=plinth-a" {
				http.Error(w, "selector", http.StatusBadRequest)
				return
			}
			var items []map[string]any
			for id, kind := range pods {
				ns, name, _ := strings.Cut(id, "/")
				md := map[string]any{"name": name, "namespace": ns}
				switch kind {
				case "DaemonSet":
					md["ownerReferences"] = []map[string]any{{"kind": "DaemonSet"}}
				case "mirror":
					md["annotations"] = map[string]string{"kubernetes.io/config.mirror": "x"}
				}
				items = append(items, map[string]any{"metadata": md})
			}
			json.NewEncoder(w).Encode(map[string]any{"items": items})
		case r.Method == http.MethodPost && strings.HasSuffix(r.URL.Path, "/eviction"):
			parts := strings.Split(r.URL.Path, "/") // /api/v1/namespaces/NS/pods/NAME/eviction
			id := parts[4] + "/" + parts[6]
			if id == "default/db" && !refused {
				refused = true
				w.WriteHeader(http.StatusTooManyRequests)
				w.Write([]byte(`{"message":"Cannot evict pod as it would violate the pod's disruption budget."}`))
				return
			}
			if pods[id] != "" {
				http.Error(w, "evicting a pod drain must leave", http.StatusForbidden)
				return
			}
			delete(pods, id)
			w.WriteHeader(http.StatusCreated)
			w.Write([]byte(`{}`))
		default:
			http.Error(w, r.Method+" "+r.URL.Path, http.StatusNotFound)
		}
	}))
	defer srv.Close()
	k := &KubeAPI{Server: srv.URL, HTTP: srv.Client()}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := k.Cordon(ctx, "plinth-a", true); err != nil || patch != `{"spec":{"unschedulable":true}}` {
		t.Fatalf("cordon: %v, patch %s", err, patch)
	}
	n, err := k.Drain(ctx, "plinth-a")
	if err != nil || n != 2 || !refused {
		t.Fatalf("drain: %d evicted, %v (refused once: %v)", n, err, refused)
	}
	if _, ok := pods["kube-system/ds"]; !ok || len(pods) != 2 {
		t.Fatalf("pods left: %v", pods)
	}
	if err := k.Cordon(ctx, "plinth-a", false); err != nil || patch != `{"spec":{"unschedulable":false}}` {
		t.Fatalf("uncordon: %v, patch %s", err, patch)
	}
	if err := k.Cordon(ctx, "plinth-unknown", true); err == nil {
		t.Fatal("cordoning an unknown node succeeded")
	}
	if ready, _, err := k.NodeReady(ctx, "plinth-a"); err != nil || !ready {
		t.Fatalf("NodeReady of a Ready node: %v, %v", ready, err)
	}
	if ready, reason, err := k.NodeReady(ctx, "plinth-new"); err != nil || ready || reason == "" {
		t.Fatalf("NodeReady of a node without conditions: %v, %q, %v", ready, reason, err)
	}
	if _, _, err := k.NodeReady(ctx, "plinth-unknown"); err == nil {
		t.Fatal("NodeReady of an unknown node succeeded")
	}
}

// TestReadyWhileStarting: Ready says "not serving yet" (ErrAPINotServing,
// so plinthctl cluster kubeconfig --wait keeps waiting) for every answer
// an API server that is still starting gives — /readyz failing, the default
// service account missing, priority and fairness refusing, the request
// after /readyz answering too late (a starved API server under TCG) — and
// nil once it serves and the account exists.
func TestReadyWhileStarting(t *testing.T) {
	var mu sync.Mutex
	readyz, sa, saDelay := http.StatusOK, http.StatusOK, time.Duration(0)
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		rz, s, d := readyz, sa, saDelay
		mu.Unlock()
		switch r.URL.Path {
		case "/readyz":
			w.WriteHeader(rz)
		case "/api/v1/namespaces/default/serviceaccounts/default":
			select {
			case <-time.After(d):
			case <-r.Context().Done():
				return
			}
			w.WriteHeader(s)
			w.Write([]byte(`{}`))
		default:
			http.NotFound(w, r)
		}
	}))
	defer srv.Close()
	k := &KubeAPI{Server: srv.URL, HTTP: srv.Client()}
	for _, c := range []struct {
		name           string
		readyz, sa     int
		saDelay        time.Duration
		wantNotServing bool
	}{
		{"serving", http.StatusOK, http.StatusOK, 0, false},
		{"readyz failing", http.StatusInternalServerError, http.StatusOK, 0, true},
		{"no default service account yet", http.StatusOK, http.StatusNotFound, 0, true},
		{"owner not bound yet", http.StatusOK, http.StatusForbidden, 0, true},
		{"priority and fairness refusing", http.StatusOK, http.StatusTooManyRequests, 0, true},
		{"unavailable", http.StatusOK, http.StatusServiceUnavailable, 0, true},
		{"the account's answer too late", http.StatusOK, http.StatusOK, 3 * time.Second, true},
	} {
		mu.Lock()
		readyz, sa, saDelay = c.readyz, c.sa, c.saDelay
		mu.Unlock()
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		err := k.Ready(ctx)
		cancel()
		if got := errors.Is(err, ErrAPINotServing); got != c.wantNotServing || (!c.wantNotServing && err != nil) {
			t.Errorf("%s: Ready = %v (want not serving: %v)", c.name, err, c.wantNotServing)
		}
	}
	// An unauthorised certificate is an error of its own, not a wait.
	mu.Lock()
	readyz = http.StatusUnauthorized
	mu.Unlock()
	if err := k.Ready(context.Background()); err == nil || errors.Is(err, ErrAPINotServing) {
		t.Errorf("401 from /readyz: Ready = %v (want an error other than not serving)", err)
	}
}
