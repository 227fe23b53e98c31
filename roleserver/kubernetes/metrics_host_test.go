//go:build built

package kubernetes

import (
	"context"
	"crypto/ed25519"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"net"
	"net/http"
	"strconv"
	"strings"
	"testing"
	"time"

	"plinth.dev/plinth/platform/layout"
	"plinth.dev/plinth/roleserver/kubernetes/pki"
	"plinth.dev/plinth/roleserver/owner"
)

// checkMetricsAPI checks the metrics API of a real control plane
// (TestControlPlaneOnHost's: no kubelet, so no metrics, but the whole
// path): the API server aggregates this controller's metrics server
// (APIService, Service, the controller's ready EndpointSlice; mTLS both
// ways), and attacks it as a pod on the node could: straight at its
// port with no certificate, with forged front-proxy headers, and as an
// authenticated user without the right (another node program's
// credentials), through the API server and around it. Another
// controller's endpoint whose metrics server is silent is marked not
// ready, and deleted once that controller is decommissioned.
func checkMetricsAPI(t *testing.T, ctx context.Context, admin *owner.KubeAPI, p *pki.PKI, ca *x509.Certificate, nodeID string, addr net.IP, decommission func(ids ...string)) {
	t.Helper()
	for deadline := time.Now().Add(2 * time.Minute); ; time.Sleep(time.Second) {
		code, body := kapiDo(t, ctx, admin, "GET", "/apis/metrics.k8s.io/v1beta1/nodes", "")
		if code == http.StatusOK && strings.Contains(body, `"kind":"NodeMetricsList"`) {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the metrics API through the API server: %d %s", code, body)
		}
	}
	if code, body := kapiDo(t, ctx, admin, "GET", metricsSlicePath(nodeID), ""); code != http.StatusOK ||
		!strings.Contains(body, `"ready":true`) || !strings.Contains(body, `"`+addr.String()+`"`) {
		t.Errorf("this controller's metrics endpoint: %d %s", code, body)
	}

	// Another node program's credentials: authenticated, no right to
	// metrics.
	pub, key, _ := ed25519.GenerateKey(rand.Reader)
	vca, vcert, err := p.LocalVolumes(ctx, "node-a", pub)
	if err != nil {
		t.Fatal(err)
	}
	other := owner.NewKubeAPI(&owner.KubernetesCredentials{CA: vca, Certificate: vcert}, key, strings.TrimPrefix(admin.Server, "https://"))
	if code, body := kapiDo(t, ctx, other, "GET", "/apis/metrics.k8s.io/v1beta1/nodes", ""); code != http.StatusForbidden {
		t.Errorf("a user without the right, through the API server: %d %s; want 403", code, body)
	}

	// Straight at the metrics server, as a pod reaching the node's
	// address: its certificate is the one the APIService trusts.
	roots := x509.NewCertPool()
	roots.AddCert(ca)
	direct := func(certs []tls.Certificate, header map[string]string) (int, string) {
		t.Helper()
		c := &http.Client{Timeout: 20 * time.Second, Transport: &http.Transport{TLSClientConfig: &tls.Config{
			RootCAs: roots, ServerName: pki.MetricsService + ".kube-system.svc", Certificates: certs}}}
		defer c.CloseIdleConnections()
		req, err := http.NewRequestWithContext(ctx, "GET", "https://"+net.JoinHostPort(addr.String(), strconv.Itoa(layout.MetricsServerPort))+"/apis/metrics.k8s.io/v1beta1/nodes", nil)
		if err != nil {
			t.Fatal(err)
		}
		for k, v := range header {
			req.Header.Set(k, v)
		}
		resp, err := c.Do(req)
		if err != nil {
			t.Fatalf("the metrics server: %v", err)
		}
		defer resp.Body.Close()
		var b strings.Builder
		buf := make([]byte, 512)
		n, _ := resp.Body.Read(buf)
		b.Write(buf[:n])
		return resp.StatusCode, b.String()
	}
	// Anonymous: refused (401), or taken for system:anonymous and
	// forbidden; forged front-proxy headers count for nothing without
	// the front-proxy certificate.
	forged := map[string]string{"X-Remote-User": "admin", "X-Remote-Group": "system:masters"}
	for _, h := range []map[string]string{nil, forged} {
		if code, body := direct(nil, h); code != http.StatusUnauthorized && (code != http.StatusForbidden || !strings.Contains(body, "system:anonymous")) {
			t.Errorf("no certificate (headers %v), straight at the metrics server: %d %s; want 401, or 403 for system:anonymous", h, code, body)
		}
	}
	otherCert := tls.Certificate{Certificate: [][]byte{vcert.Raw}, PrivateKey: key}
	if code, body := direct([]tls.Certificate{otherCert}, forged); code != http.StatusForbidden || !strings.Contains(body, "plinth:local-volumes:node-a") {
		t.Errorf("a user without the right (forged headers ignored), straight at the metrics server: %d %s; want 403 for plinth:local-volumes:node-a", code, body)
	}

	// Another controller's endpoint, its metrics server silent (a
	// controller that lost its power): marked not ready, and deleted
	// once it is decommissioned.
	const gone = "plinth-00000000000000000000000000000000"
	ep := metricsEndpoint(gone, net.IPv4(192, 0, 2, 1), true)
	if code, body := kapiDo(t, ctx, admin, "POST", strings.TrimSuffix(ep.path, "/"+metricsSliceName(gone)), ep.body); code != http.StatusCreated {
		t.Fatalf("another controller's metrics endpoint: %d %s", code, body)
	}
	for deadline := time.Now().Add(time.Minute); ; time.Sleep(time.Second) {
		code, body := kapiDo(t, ctx, admin, "GET", ep.path, "")
		if code == http.StatusOK && strings.Contains(body, `"ready":false`) {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("a silent controller's metrics endpoint stays ready: %d %s", code, body)
		}
	}
	decommission(gone)
	for deadline := time.Now().Add(time.Minute); ; time.Sleep(time.Second) {
		code, body := kapiDo(t, ctx, admin, "GET", ep.path, "")
		if code == http.StatusNotFound {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("a decommissioned controller's metrics endpoint stays: %d %s", code, body)
		}
	}
}
