package kubernetes

import (
	"context"
	"crypto/ed25519"
	"crypto/rand"
	"crypto/tls"
	"encoding/json"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"plinth.dev/plinth/platform/pki"
)

// TestReportStopped: the stopped worker's Node gets Ready=False with
// NotReadyReason, patched as the kubelet (its client certificate) on the
// first API server that answers; a worker that never ran reports nothing.
func TestReportStopped(t *testing.T) {
	ca, err := pki.NewCA("test kubernetes CA", time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	issue := func(cn string, u pki.Usage, ips ...net.IP) (*tls.Certificate, ed25519.PrivateKey) {
		pub, key, _ := ed25519.GenerateKey(rand.Reader)
		c, err := ca.Issue(pki.Template{CommonName: cn, PublicKey: pub, Usage: u, IPAddresses: ips})
		if err != nil {
			t.Fatal(err)
		}
		return &tls.Certificate{Certificate: [][]byte{c.Raw}, PrivateKey: key, Leaf: c}, key
	}
	serverCert, _ := issue("apiserver", pki.UsageServer, net.ParseIP("127.0.0.1"))
	clientCert, clientKey := issue("system:node:plinth-x", pki.UsageClient)

	type request struct{ method, path, contentType, user string }
	var got []request
	var patch map[string]any
	srv := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		b, _ := io.ReadAll(r.Body)
		user := ""
		if len(r.TLS.PeerCertificates) > 0 {
			user = r.TLS.PeerCertificates[0].Subject.CommonName
		}
		got = append(got, request{r.Method, r.URL.Path, r.Header.Get("Content-Type"), user})
		if err := json.Unmarshal(b, &patch); err != nil {
			t.Errorf("patch %q: %v", b, err)
		}
		w.Write([]byte(`{"kind":"Node"}`))
	}))
	srv.TLS = &tls.Config{Certificates: []tls.Certificate{*serverCert}, ClientAuth: tls.RequireAndVerifyClientCert, ClientCAs: ca.CertPool()}
	srv.StartTLS()
	defer srv.Close()
	// A closed port first: the next server is tried.
	dead, _ := net.Listen("tcp", "127.0.0.1:0")
	deadAddr := dead.Addr().String()
	dead.Close()

	w := &Worker{NodeID: "plinth-x"}
	ctx := context.Background()
	if err := w.ReportStopped(ctx, []string{srv.Listener.Addr().String()}); err != nil || len(got) != 0 {
		t.Fatalf("a worker that never ran: %v, %d requests; want nil, none", err, len(got))
	}
	w.running.Store(&workerCredentials{keys: &workerKeys{kubeletClient: clientKey},
		certs: &WorkerCertificates{CA: ca.Certificate, KubeletClient: clientCert.Leaf}})
	if err := w.ReportStopped(ctx, nil); err == nil {
		t.Error("no API server: no error")
	}
	if err := w.ReportStopped(ctx, []string{deadAddr, srv.Listener.Addr().String()}); err != nil {
		t.Fatal(err)
	}
	want := request{http.MethodPatch, "/api/v1/nodes/plinth-x/status", "application/strategic-merge-patch+json", "system:node:plinth-x"}
	if len(got) != 1 || got[0] != want {
		t.Fatalf("requests %+v, want one %+v", got, want)
	}
	conds := patch["status"].(map[string]any)["conditions"].([]any)
	c := conds[0].(map[string]any)
	if len(conds) != 1 || c["type"] != "Ready" || c["status"] != "False" || c["reason"] != NotReadyReason {
		t.Fatalf("patch %v: want the Ready condition False with reason %s", patch, NotReadyReason)
	}
	if _, err := time.Parse(time.RFC3339, c["lastTransitionTime"].(string)); err != nil {
		t.Errorf("lastTransitionTime: %v", err)
	}

	// An API server that refuses: its answer is in the error.
	refusing := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		http.Error(w, `{"reason":"Forbidden"}`, http.StatusForbidden)
	}))
	refusing.TLS = srv.TLS
	refusing.StartTLS()
	defer refusing.Close()
	if err := w.ReportStopped(ctx, []string{refusing.Listener.Addr().String()}); err == nil || !strings.Contains(err.Error(), "403") {
		t.Fatalf("refused patch: %v, want the 403 in the error", err)
	}
}
