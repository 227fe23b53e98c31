//go:build built

package kubernetes

import (
	"context"
	"crypto/ed25519"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"io"
	"net"
	"net/http"
	"strconv"
	"strings"
	"testing"
	"time"

	"plinth.dev/plinth/roleserver/kubernetes/pki"
)

// checkDecommissionedIdentities: a node's Kubernetes identities (its
// kubelet, its service components, its local volume provisioner), with
// certificates that live on, work until the node is decommissioned and
// are refused for reads and writes within a minute after (the
// authorization webhook, authzwebhook.go); another node's keep working.
// The API server asks the webhook about the decommissioned node's users
// alone: never while no node is decommissioned, never for a serving
// node's (its metrics count the calls).
// decommission adds nodes to the curator's list as the test's store
// lists them.
func checkDecommissionedIdentities(t *testing.T, ctx context.Context, p *pki.PKI, server string, node net.IP, api func(method, path, body string) (int, []byte), decommission func(ids ...string)) {
	t.Helper()
	const gone, kept = "plinth-00000000000000000000000000000d0e", "plinth-0000000000000000000000000000ce9f"
	clientOf := func(ca, cert *x509.Certificate, key ed25519.PrivateKey) *http.Client {
		pool := x509.NewCertPool()
		pool.AddCert(ca)
		return &http.Client{Timeout: 20 * time.Second, Transport: &http.Transport{TLSClientConfig: &tls.Config{
			RootCAs: pool, Certificates: []tls.Certificate{{Certificate: [][]byte{cert.Raw}, PrivateKey: key}}}}}
	}
	type identity struct {
		what   string
		client *http.Client
		// read and write are a GET path and a PATCH (path, merge patch)
		// the identity may do while its node serves.
		read, write, patch string
	}
	identities := func(id string) []identity {
		t.Helper()
		if code, b := api("POST", "/api/v1/nodes", `{"apiVersion":"v1","kind":"Node","metadata":{"name":"`+id+`"}}`); code != http.StatusCreated {
			t.Fatalf("creating Node %s: %d %s", id, code, b)
		}
		_, ck, _ := ed25519.GenerateKey(rand.Reader)
		sp, _, _ := ed25519.GenerateKey(rand.Reader)
		kc, err := p.Kubelet(ctx, id, []net.IP{node}, ck.Public(), sp)
		if err != nil {
			t.Fatal(err)
		}
		_, pk, _ := ed25519.GenerateKey(rand.Reader)
		ca, proxy, err := p.Proxy(ctx, id, pk.Public())
		if err != nil {
			t.Fatal(err)
		}
		_, vk, _ := ed25519.GenerateKey(rand.Reader)
		_, volumes, err := p.LocalVolumes(ctx, id, vk.Public())
		if err != nil {
			t.Fatal(err)
		}
		return []identity{
			{"kubelet", clientOf(kc.CA, kc.Client, ck), "/api/v1/nodes/" + id, "/api/v1/nodes/" + id + "/status", `{"status":{"conditions":[{"type":"Ready","status":"False","reason":"Test"}]}}`},
			{"service components", clientOf(ca, proxy, pk), "/api/v1/services", "", ""},
			{"local volume provisioner", clientOf(ca, volumes, vk), "/api/v1/persistentvolumes", "", ""},
		}
	}
	do := func(c *http.Client, method, path, body string) (int, string) {
		req, _ := http.NewRequestWithContext(ctx, method, server+path, strings.NewReader(body))
		req.Header.Set("Content-Type", "application/merge-patch+json")
		resp, err := c.Do(req)
		if err != nil {
			return 0, err.Error()
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, string(b)
	}
	goneIDs, keptIDs := identities(gone), identities(kept)
	for _, set := range [][]identity{goneIDs, keptIDs} {
		for _, i := range set {
			if code, b := do(i.client, "GET", i.read, ""); code != http.StatusOK {
				t.Fatalf("%s of a serving node reads %s: %d %s", i.what, i.read, code, b)
			}
		}
	}
	if n := webhookCalls(t, api); n != 0 {
		t.Errorf("the API server asked the webhook %d times with no node decommissioned", n)
	}
	decommission(gone)
	deadline := time.Now().Add(time.Minute)
	for _, i := range goneIDs {
		for {
			code, b := do(i.client, "GET", i.read, "")
			if code == http.StatusForbidden && strings.Contains(b, "decommissioned") {
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("%s of the decommissioned node still reads %s a minute after: %d %s", i.what, i.read, code, b)
			}
			time.Sleep(500 * time.Millisecond)
		}
		if i.write != "" {
			if code, b := do(i.client, "PATCH", i.write, i.patch); code != http.StatusForbidden {
				t.Errorf("%s of the decommissioned node writes %s: %d %s", i.what, i.write, code, b)
			}
		}
	}
	// Its Node goes too (decommission.go); another node's stays.
	for deadline := time.Now().Add(time.Minute); ; time.Sleep(500 * time.Millisecond) {
		code, b := api("GET", "/api/v1/nodes/"+gone, "")
		if code == http.StatusNotFound {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the decommissioned node's Node a minute after: %d %s", code, b)
		}
	}
	if code, b := api("GET", "/api/v1/nodes/"+kept, ""); code != http.StatusOK {
		t.Errorf("another node's Node: %d %s", code, b)
	}
	calls := webhookCalls(t, api)
	if calls == 0 {
		t.Error("the decommissioned node's users were refused without the webhook")
	}
	for _, i := range keptIDs {
		if code, b := do(i.client, "GET", i.read, ""); code != http.StatusOK {
			t.Errorf("%s of another node reads %s: %d %s", i.what, i.read, code, b)
		}
		if i.write != "" {
			if code, b := do(i.client, "PATCH", i.write, i.patch); code != http.StatusOK {
				t.Errorf("%s of another node writes %s: %d %s", i.what, i.write, code, b)
			}
		}
	}
	if n := webhookCalls(t, api); n != calls {
		t.Errorf("the API server asked the webhook %d times about a serving node's users", n-calls)
	}
}

// webhookCalls is how many times the API server asked the authorization
// webhook, from its metrics.
func webhookCalls(t *testing.T, api func(method, path, body string) (int, []byte)) int {
	t.Helper()
	code, b := api("GET", "/metrics", "")
	if code != http.StatusOK {
		t.Fatalf("the API server's metrics: %d %s", code, b)
	}
	n := 0
	for line := range strings.Lines(string(b)) {
		if rest, ok := strings.CutPrefix(line, "apiserver_authorization_webhook_duration_seconds_count{"); ok && strings.Contains(rest, `name="plinth-decommissioned"`) {
			v, err := strconv.ParseFloat(strings.TrimSpace(rest[strings.LastIndexByte(rest, ' ')+1:]), 64)
			if err != nil {
				t.Fatalf("metrics line %q: %v", line, err)
			}
			n += int(v)
		}
	}
	return n
}
