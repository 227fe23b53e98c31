package kubernetes

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"fmt"
	"io"
	"net/http"
	"strings"
	"time"

	"plinth.dev/plinth/platform/supervisor"
	"plinth.dev/plinth/roleserver/kubernetes/pki"
)

// rbacObject is one RBAC object Plinth keeps in the cluster, applied
// server-side (field manager "plinth"), so a change here reaches existing
// clusters on the next controller start.
type rbacObject struct {
	path, body string
}

// plinthRBAC is what the API server's default roles do not give Plinth's
// own components. The DNS server (CoreDNS's kubernetes plugin) watches
// Namespaces besides Services and EndpointSlices; it runs as
// pki.ProxyUser, whose default role (system:node-proxier) does not cover
// them.
var plinthRBAC = []rbacObject{
	{"/apis/rbac.authorization.k8s.io/v1/clusterroles/plinth:node-services", `{
  "apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRole",
  "metadata": {"name": "plinth:node-services"},
  "rules": [{"apiGroups": [""], "resources": ["namespaces"], "verbs": ["get", "list", "watch"]}]}`},
	{"/apis/rbac.authorization.k8s.io/v1/clusterrolebindings/plinth:node-services", `{
  "apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRoleBinding",
  "metadata": {"name": "plinth:node-services"},
  "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": "plinth:node-services"},
  "subjects": [{"apiGroup": "rbac.authorization.k8s.io", "kind": "User", "name": "` + pki.ProxyUser + `"}]}`},
}

// rbacValidity is how long the controller's own administrator
// certificate for applying plinthRBAC lives (it never leaves memory).
const rbacValidity = 10 * time.Minute

// applyRBAC is a one-shot runnable: it applies plinthRBAC through the
// local API server with a short-lived administrator certificate, and is
// done.
func applyRBAC(p *pki.PKI, nodeID, server string) supervisor.Runnable {
	return func(ctx context.Context) error {
		key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
		if err != nil {
			return err
		}
		ca, cert, err := p.Admin(ctx, &key.PublicKey, "controller-"+nodeID, rbacValidity)
		if err != nil {
			return fmt.Errorf("certificate for applying Plinth's roles: %w", err)
		}
		pool := x509.NewCertPool()
		pool.AddCert(ca)
		client := &http.Client{Timeout: time.Minute, Transport: &http.Transport{TLSClientConfig: &tls.Config{
			RootCAs: pool, MinVersion: tls.VersionTLS12,
			Certificates: []tls.Certificate{{Certificate: [][]byte{cert.Raw}, PrivateKey: key}},
		}}}
		defer client.CloseIdleConnections()
		for _, o := range plinthRBAC {
			if err := serverSideApply(ctx, client, server+o.path, o.body); err != nil {
				return err
			}
		}
		supervisor.Logger(ctx).Info("applied Plinth's RBAC objects", "count", len(plinthRBAC))
		supervisor.Signal(ctx, supervisor.SignalDone)
		return nil
	}
}

// serverSideApply PATCHes body to url as an apply patch.
func serverSideApply(ctx context.Context, client *http.Client, url, body string) error {
	req, err := http.NewRequestWithContext(ctx, http.MethodPatch, url+"?fieldManager=plinth&force=true", strings.NewReader(body))
	if err != nil {
		return err
	}
	req.Header.Set("Content-Type", "application/apply-patch+yaml")
	resp, err := client.Do(req)
	if err != nil {
		return fmt.Errorf("applying %s: %w", url, err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(io.LimitReader(resp.Body, 4096))
	if resp.StatusCode != http.StatusOK && resp.StatusCode != http.StatusCreated {
		return fmt.Errorf("applying %s: %s: %s", url, resp.Status, b)
	}
	return nil
}
