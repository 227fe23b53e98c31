//go:build built

package kubernetes

import (
	"context"
	"crypto/ed25519"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"plinth.dev/plinth/api/clusterpb"
	"plinth.dev/plinth/platform/event"
	"plinth.dev/plinth/platform/event/memory"
	"plinth.dev/plinth/platform/layout"
	"plinth.dev/plinth/platform/logtree"
	"plinth.dev/plinth/platform/supervisor"
	"plinth.dev/plinth/roleserver/consensus"
	"plinth.dev/plinth/roleserver/internal/testutil"
	"plinth.dev/plinth/roleserver/kubernetes/pki"
	"plinth.dev/plinth/roleserver/localstorage"
	"plinth.dev/plinth/roleserver/owner"
)

// TestControlPlaneOnHost runs the real control plane — the kube binary's
// API server, controller manager and scheduler, as the Controller runs
// them — on the build host against an in-process etcd member, through the
// confined etcd endpoint: the API server serves, the break-glass
// certificate (pki.Admin) is system:masters, a Node gets a pod CIDR from
// the core's node IPAM, a worker is cordoned, drained and uncordoned
// as `plinthctl node update` does (owner.KubeAPI), the audit stream has what
// it should and nothing it should not, and the API server's keys
// land under /kubernetes/ only. Natively this takes seconds; under TCG it would take
// minutes, so the VM tests only check what needs a node.
func TestControlPlaneOnHost(t *testing.T) {
	kube := os.Getenv("PLINTH_KUBE")
	if kube == "" {
		t.Fatal("PLINTH_KUBE unset: run `make unit`, which builds out/bin/kube")
	}
	dir, err := os.MkdirTemp("", "cp")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	// As on a node: the components' users may walk to their directories.
	if err := os.Chmod(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	root := &localstorage.Root{}
	if err := localstorage.Place(root, dir); err != nil {
		t.Fatal(err)
	}
	if err := localstorage.Create(&root.Data, 0o700); err != nil {
		t.Fatal(err)
	}
	if err := localstorage.Create(&root.Ephemeral, 0o755); err != nil {
		t.Fatal(err)
	}
	const nodeID = "plinth-0123456789abcdef0123456789abcdef"
	_, key, _ := ed25519.GenerateKey(rand.Reader)
	peer, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	port := peer.Addr().(*net.TCPAddr).Port
	peer.Close()
	cons := testutil.NewLoopbackConsensus(consensus.Config{Data: &root.Data.Etcd, Ephemeral: &root.Ephemeral.Consensus,
		NodeID: nodeID, NodePrivateKey: key}, port)

	lt := logtree.New(20000)
	status := &memory.Value[*Status]{}
	policy := &memory.Value[*clusterpb.ClusterConfiguration]{}
	policy.Set(&clusterpb.ClusterConfiguration{Kubernetes: &clusterpb.KubernetesPolicy{AllowedHostPaths: testAdmissionAllowed}})
	ctx, cancel := context.WithTimeout(context.Background(), 6*time.Minute)
	defer cancel()
	w := cons.Watch()
	defer w.Close()
	var st *consensus.Status
	// The nodes decommissioned, as the curator's store would list them.
	var decommissioned atomic.Pointer[[]string]
	decommissioned.Store(&[]string{})
	sup := supervisor.New(ctx, lt, func(ctx context.Context) error {
		if err := supervisor.Run(ctx, "consensus", cons.Run); err != nil {
			return err
		}
		s, err := w.Get(ctx, consensus.FilterRunning)
		if err != nil {
			return err
		}
		st = s
		c := &Controller{Root: root, NodeID: nodeID, Address: hostAddress(t),
			Consensus: s, Status: status, KubeBinary: kube, Policy: policy, DecommissionPoll: time.Second,
			DecommissionedNodes: func(context.Context) ([]string, error) { return *decommissioned.Load(), nil }}
		if err := supervisor.Run(ctx, "controller", c.Run); err != nil {
			return err
		}
		supervisor.Signal(ctx, supervisor.SignalHealthy)
		<-ctx.Done()
		return ctx.Err()
	}, supervisor.Options{})
	t.Cleanup(func() {
		cancel()
		sup.Wait()
		// PLINTH_TEST_LOG=FILE keeps every component's whole log.
		if f := os.Getenv("PLINTH_TEST_LOG"); f != "" {
			var b strings.Builder
			for _, e := range lt.Read("", 0) {
				b.WriteString(e.String() + "\n")
			}
			os.WriteFile(f, []byte(b.String()), 0o644)
		}
		if t.Failed() {
			for _, dn := range []string{"root.controller", "root.controller.apiserver.out", "root.controller.controller-manager.out", "root.controller.scheduler.out", "root.controller.metrics-server.out"} {
				for _, e := range lt.Read(dn, 60) {
					if e.DN == dn || dn == "root.controller" && !strings.HasSuffix(e.DN, ".out") {
						t.Log(e.String())
					}
				}
			}
		}
	})
	sw := status.Watch()
	defer sw.Close()
	s, err := sw.Get(ctx, event.Filter(func(s *Status) bool { return s != nil }))
	if err != nil {
		t.Fatalf("API server never served: %v", err)
	}

	// A break-glass administrator's client (system:masters), as the
	// controller's own steps use.
	kv, err := st.CuratorClient()
	if err != nil {
		t.Fatal(err)
	}
	defer kv.Close()
	adminPub, adminKey, _ := ed25519.GenerateKey(rand.Reader)
	ca, cert, err := pki.New(kv).Admin(ctx, adminPub, "test", time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	pool := x509.NewCertPool()
	pool.AddCert(ca)
	client := &http.Client{Timeout: 20 * time.Second, Transport: &http.Transport{TLSClientConfig: &tls.Config{
		RootCAs: pool, Certificates: []tls.Certificate{{Certificate: [][]byte{cert.Raw}, PrivateKey: adminKey}},
	}}}
	kapi := &owner.KubeAPI{Server: s.APIServer, HTTP: client}
	api := func(method, path, body string) (int, []byte) {
		t.Helper()
		code, b, _, err := apiRequest(ctx, kapi, method, path, body)
		if err != nil {
			t.Fatalf("%s %s: %v", method, path, err)
		}
		return code, []byte(b)
	}
	checkAdmission(t, ctx, kapi)
	checkTenantAdmission(t, ctx, kapi, hostAddress(t))
	checkComponentUsers(t, root)
	checkOwnerRevocation(t, ctx, s.APIServer, ca, pki.New(kv), policy)
	checkNodeIPAM(t, api)
	// Plinth's RBAC objects are applied: the DNS server's user may watch
	// Namespaces (the API server's default roles do not let it).
	deadline := time.Now().Add(time.Minute)
	for {
		_, b := api("POST", "/apis/authorization.k8s.io/v1/subjectaccessreviews", `{"apiVersion":"authorization.k8s.io/v1",
			"kind":"SubjectAccessReview","spec":{"user":"`+pki.ProxyPrefix+nodeID+`","groups":["`+pki.ProxyGroup+`"],"resourceAttributes":{"verb":"watch","resource":"namespaces"}}}`)
		var r struct {
			Status struct{ Allowed bool } `json:"status"`
		}
		if json.Unmarshal(b, &r) == nil && r.Status.Allowed {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s may not watch Namespaces: %s", pki.ProxyPrefix+nodeID, b)
		}
		time.Sleep(time.Second)
	}
	checkLocalVolumes(t, ctx, kapi, pki.New(kv), s.APIServer, func(ids ...string) { decommissioned.Store(&ids) })
	checkMetricsAPI(t, ctx, kapi, pki.New(kv), ca, nodeID, hostAddress(t), func(ids ...string) { decommissioned.Store(&ids) })
	checkDecommissionedIdentities(t, ctx, pki.New(kv), s.APIServer, hostAddress(t), api, func(ids ...string) { decommissioned.Store(&ids) })
	// A removed worker reports its Node NotReady as its kubelet: the
	// node authorizer and NodeRestriction let it patch its own status.
	clientPub, clientKey, _ := ed25519.GenerateKey(rand.Reader)
	serverPub, _, _ := ed25519.GenerateKey(rand.Reader)
	kc, err := pki.New(kv).Kubelet(ctx, nodeID, []net.IP{hostAddress(t)}, clientPub, serverPub)
	if err != nil {
		t.Fatal(err)
	}
	kca, kubeletCert := kc.CA, kc.Client
	if code, b := api("POST", "/api/v1/nodes", `{"apiVersion":"v1","kind":"Node","metadata":{"name":"`+nodeID+`"}}`); code != http.StatusCreated {
		t.Fatalf("creating the node's Node: %d %s", code, b)
	}
	wk := &Worker{NodeID: nodeID}
	wk.running.Store(&workerCredentials{keys: &workerKeys{kubeletClient: clientKey}, certs: &WorkerCertificates{CA: kca, KubeletClient: kubeletCert}})
	if err := wk.ReportStopped(ctx, []string{strings.TrimPrefix(s.APIServer, "https://")}); err != nil {
		t.Fatalf("reporting the stopped worker: %v", err)
	}
	_, b := api("GET", "/api/v1/nodes/"+nodeID, "")
	var node struct {
		Status struct {
			Conditions []struct{ Type, Status, Reason string }
		} `json:"status"`
	}
	if err := json.Unmarshal(b, &node); err != nil || len(node.Status.Conditions) != 1 ||
		node.Status.Conditions[0].Type != "Ready" || node.Status.Conditions[0].Status != "False" || node.Status.Conditions[0].Reason != NotReadyReason {
		t.Fatalf("the stopped worker's Node: %s (%v); want Ready False, reason %s", b, err, NotReadyReason)
	}

	// An update takes a worker out of service as plinthctl does
	// (owner.KubeAPI): cordoned, its pods evicted, uncordoned.
	for _, name := range []string{"a", "b"} {
		if code, b := api("POST", "/api/v1/namespaces/default/pods", `{"apiVersion":"v1","kind":"Pod","metadata":{"name":"`+name+`"},
			"spec":{"nodeName":"plinth-test","terminationGracePeriodSeconds":0,"containers":[{"name":"c","image":"plinth.dev/testpod:v1"}]}}`); code != http.StatusCreated {
			t.Fatalf("creating pod %s: %d %s", name, code, b)
		}
	}
	if ready, reason, err := kapi.NodeReady(ctx, nodeID); err != nil || ready || reason != NotReadyReason {
		t.Fatalf("NodeReady of the stopped worker: %v, %q, %v; want false, %q", ready, reason, err, NotReadyReason)
	}
	if err := kapi.Cordon(ctx, "plinth-test", true); err != nil {
		t.Fatal(err)
	}
	if _, b := api("GET", "/api/v1/nodes/plinth-test", ""); !strings.Contains(string(b), `"unschedulable":true`) {
		t.Fatalf("cordoned Node: %s", b)
	}
	dctx, dcancel := context.WithTimeout(ctx, time.Minute)
	if n, err := kapi.Drain(dctx, "plinth-test"); err != nil || n != 2 {
		t.Fatalf("drain: %d evicted, %v", n, err)
	}
	dcancel()
	if _, b := api("GET", "/api/v1/pods?fieldSelector=spec.nodeName%3Dplinth-test", ""); strings.Contains(string(b), `"name":"a"`) {
		t.Fatalf("pods left after the drain: %s", b)
	}
	if err := kapi.Cordon(ctx, "plinth-test", false); err != nil {
		t.Fatal(err)
	}
	if _, b := api("GET", "/api/v1/nodes/plinth-test", ""); strings.Contains(string(b), `"unschedulable":true`) {
		t.Fatalf("uncordoned Node: %s", b)
	}
	// plinthctl role taint: the control plane taint, once however often
	// it is put on, gone when taken away.
	for range 2 {
		if err := kapi.Taint(ctx, "plinth-test", true); err != nil {
			t.Fatal(err)
		}
	}
	if _, b := api("GET", "/api/v1/nodes/plinth-test", ""); strings.Count(string(b), owner.ControlPlaneTaint) != 1 || !strings.Contains(string(b), `"effect":"NoSchedule"`) {
		t.Fatalf("tainted Node: %s", b)
	}
	if err := kapi.Taint(ctx, "plinth-test", false); err != nil {
		t.Fatal(err)
	}
	if _, b := api("GET", "/api/v1/nodes/plinth-test", ""); strings.Contains(string(b), owner.ControlPlaneTaint) {
		t.Fatalf("untainted Node: %s", b)
	}

	// Everything the API server stored is below /kubernetes/.
	k8s, err := st.KubernetesClient()
	if err != nil {
		t.Fatal(err)
	}
	defer k8s.Close()
	checkSecretsAtRest(t, ctx, kapi, k8s, pki.New(kv), nodeID)
	checkAudit(t, lt, api, nodeID)
	checkAuditPersists(t, ctx, kapi, root, status, policy)
	resp, err := k8s.Get(ctx, "/registry/minions/plinth-test")
	if err != nil || len(resp.Kvs) != 1 {
		t.Fatalf("the Node is not under /kubernetes/registry: %v, %v", resp, err)
	}
}

// checkAudit: the API server's audit stream (plinthctl node logs --audit)
// has the controller's RBAC changes with their bodies, under the break-glass
// user (plinth-controller:<node ID>, never the owner's prefix); reads of
// RBAC objects and Secrets as Metadata, never a Secret's contents (the
// Secret checkSecretsAtRest wrote, and rewrote); no health probe; no
// event over the size bound.
func checkAudit(t *testing.T, lt *logtree.Tree, api func(method, path, body string) (int, []byte), nodeID string) {
	t.Helper()
	if code, b := api("GET", "/apis/rbac.authorization.k8s.io/v1/clusterroles/cluster-admin", ""); code != http.StatusOK {
		t.Fatalf("reading a ClusterRole: %d %s", code, b)
	}
	type event struct {
		Level, Verb, RequestURI string
		User                    struct{ Username string }
		ObjectRef               struct{ Resource, Name string }
		RequestObject           json.RawMessage
	}
	var rbacWrite, rbacRead, secret bool
	for deadline := time.Now().Add(time.Minute); !rbacWrite || !rbacRead || !secret; time.Sleep(500 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("the audit stream lacks events: RBAC change by the controller %v, RBAC read %v, Secret %v", rbacWrite, rbacRead, secret)
		}
		for _, e := range lt.Read("root.controller.apiserver."+AuditStream, 0) {
			var ev event
			if err := json.Unmarshal([]byte(e.Message), &ev); err != nil {
				t.Fatalf("not an audit event: %v: %s", err, e.Message)
			}
			if len(e.Message) > auditMaxEventSize || strings.Contains(e.Message, "hunter2") || strings.Contains(e.Message, "aHVudGVyMg") ||
				strings.HasPrefix(ev.RequestURI, "/readyz") || strings.HasPrefix(ev.RequestURI, "/healthz") || strings.HasPrefix(ev.RequestURI, "/livez") {
				t.Fatalf("an audit event that should not be (a Secret's contents, a health probe, over %d bytes): %.300s", auditMaxEventSize, e.Message)
			}
			switch {
			case ev.ObjectRef.Resource == "clusterrolebindings" && ev.Verb == "patch" && ev.User.Username == pki.ControllerPrefix+nodeID:
				rbacWrite = true
				if ev.Level != "RequestResponse" || len(ev.RequestObject) == 0 {
					t.Errorf("an RBAC change by the controller, at level %s with request %s; want RequestResponse with the body", ev.Level, ev.RequestObject)
				}
			case ev.ObjectRef.Resource == "clusterroles" && ev.ObjectRef.Name == "cluster-admin" && ev.Verb == "get":
				rbacRead = true
				if ev.Level != "Metadata" {
					t.Errorf("an RBAC read at level %s, want Metadata", ev.Level)
				}
			case ev.ObjectRef.Resource == "secrets" && ev.ObjectRef.Name == "s1":
				secret = true
				if ev.Level != "Metadata" {
					t.Errorf("a Secret's %s at level %s, want Metadata", ev.Verb, ev.Level)
				}
			}
		}
	}
}

// checkComponentUsers: each control plane component runs as its own
// unprivileged user, and its directory is its own (mode 0700).
func checkComponentUsers(t *testing.T, root *localstorage.Root) {
	t.Helper()
	ctl := &root.Ephemeral.Kubernetes.Controller
	for name, c := range map[string]struct {
		uid int
		dir string
	}{
		"apiserver":          {layout.APIServerUser, ctl.APIServer.Path()},
		"controller-manager": {layout.ControllerManagerUser, ctl.ControllerManager.Path()},
		"scheduler":          {layout.SchedulerUser, ctl.Scheduler.Path()},
		"metrics-server":     {layout.MetricsServerUser, ctl.MetricsServer.Path()},
	} {
		var st unix.Stat_t
		if err := unix.Stat(c.dir, &st); err != nil || int(st.Uid) != c.uid || st.Mode&0o777 != 0o700 {
			t.Errorf("%s's directory %s: uid %d mode %o, %v; want uid %d mode 700", name, c.dir, st.Uid, st.Mode&0o777, err, c.uid)
		}
		// Its process: the kube binary with this component's argument
		// and a flag naming a file in its directory.
		found := false
		procs, _ := filepath.Glob("/proc/[0-9]*/cmdline")
		for _, p := range procs {
			b, err := os.ReadFile(p)
			args := strings.Split(string(b), "\x00")
			if err != nil || len(args) < 2 || args[1] != name || !strings.Contains(string(b), c.dir) {
				continue
			}
			found = true
			status, _ := os.ReadFile(filepath.Join(filepath.Dir(p), "status"))
			if !regexp.MustCompile(fmt.Sprintf(`(?m)^Uid:\t%d\t%d\t%d\t%d$`, c.uid, c.uid, c.uid, c.uid)).Match(status) {
				t.Errorf("%s does not run as user %d:\n%s", name, c.uid, status)
			}
		}
		if !found {
			t.Errorf("no %s process found", name)
		}
	}
}

// apiRequest sends a JSON request (a PATCH: a JSON merge patch) to the API server of k, with its
// client, and returns the answer's status, body and headers.
func apiRequest(ctx context.Context, k *owner.KubeAPI, method, path, body string) (int, string, http.Header, error) {
	return apiRequestWith(ctx, k, method, path, body, nil)
}

// apiRequestWith is apiRequest with more headers (impersonation).
func apiRequestWith(ctx context.Context, k *owner.KubeAPI, method, path, body string, h http.Header) (int, string, http.Header, error) {
	req, err := http.NewRequestWithContext(ctx, method, k.Server+path, strings.NewReader(body))
	if err != nil {
		return 0, "", nil, err
	}
	for k, v := range h {
		req.Header[k] = v
	}
	req.Header.Set("Content-Type", "application/json")
	if method == http.MethodPatch {
		req.Header.Set("Content-Type", "application/merge-patch+json")
	}
	resp, err := k.HTTP.Do(req)
	if err != nil {
		return 0, "", nil, err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b), resp.Header, err
}

// hostAddress is a non-loopback IPv4 address of the host (the API server
// refuses to advertise a loopback one).
func hostAddress(t *testing.T) net.IP {
	t.Helper()
	addrs, err := net.InterfaceAddrs()
	if err != nil {
		t.Fatal(err)
	}
	for _, a := range addrs {
		if n, ok := a.(*net.IPNet); ok && n.IP.To4() != nil && !n.IP.IsLoopback() {
			return n.IP.To4()
		}
	}
	t.Fatal("the host has no non-loopback IPv4 address")
	return nil
}

// checkNodeIPAM: the core's node IPAM gives Nodes pod CIDRs of their own,
// one after the other, and keeps one a Node already has (the controller
// manager's, on a cluster from before) out of the next allocations.
func checkNodeIPAM(t *testing.T, api func(method, path, body string) (int, []byte)) {
	t.Helper()
	create := func(name, podCIDR string) {
		body := `{"apiVersion":"v1","kind":"Node","metadata":{"name":"` + name + `"}}`
		if podCIDR != "" {
			body = `{"apiVersion":"v1","kind":"Node","metadata":{"name":"` + name + `"},"spec":{"podCIDR":"` + podCIDR + `","podCIDRs":["` + podCIDR + `"]}}`
		}
		if code, b := api("POST", "/api/v1/nodes", body); code != http.StatusCreated {
			t.Fatalf("creating Node %s: %d %s", name, code, b)
		}
	}
	podCIDR := func(name string) string {
		deadline := time.Now().Add(time.Minute)
		for {
			_, b := api("GET", "/api/v1/nodes/"+name, "")
			var n struct {
				Spec struct{ PodCIDR string } `json:"spec"`
			}
			if json.Unmarshal(b, &n) == nil && n.Spec.PodCIDR != "" {
				return n.Spec.PodCIDR
			}
			if time.Now().After(deadline) {
				t.Fatalf("Node %s: no pod CIDR: %s", name, b)
			}
			time.Sleep(200 * time.Millisecond)
		}
	}
	create("plinth-test", "")
	if got := podCIDR("plinth-test"); got != "10.244.0.0/24" {
		t.Errorf("the first Node's pod CIDR is %s, want 10.244.0.0/24", got)
	}
	// The next free one, taken by a Node that comes with it.
	create("plinth-old", "10.244.1.0/24")
	if got := podCIDR("plinth-old"); got != "10.244.1.0/24" {
		t.Errorf("a Node's own pod CIDR became %s", got)
	}
	create("plinth-new", "")
	if got := podCIDR("plinth-new"); got != "10.244.2.0/24" {
		t.Errorf("the third Node's pod CIDR is %s, want 10.244.2.0/24 (neither another's nor the kept one)", got)
	}
	// A Node registered again gets its CIDR back.
	if code, b := api("DELETE", "/api/v1/nodes/plinth-new", ""); code != http.StatusOK {
		t.Fatalf("deleting Node plinth-new: %d %s", code, b)
	}
	create("plinth-new", "")
	if got := podCIDR("plinth-new"); got != "10.244.2.0/24" {
		t.Errorf("plinth-new registered again got %s, not its 10.244.2.0/24", got)
	}
}
