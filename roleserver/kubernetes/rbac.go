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
	"slices"
	"strings"
	"time"

	"plinth.dev/plinth/api/clusterpb"
	"plinth.dev/plinth/platform/event/memory"
	"plinth.dev/plinth/platform/supervisor"
	"plinth.dev/plinth/roleserver/kubernetes/pki"
)

// rbacObject is one RBAC object Plinth keeps in the cluster, applied
// server-side (field manager "plinth"), so a change here reaches existing
// clusters on the next controller start.
type rbacObject struct {
	path, body string
}

// plinthRBAC is what the API server's default roles do not give
// Plinth's own components:
//   - the DNS server (CoreDNS's kubernetes plugin) watches Namespaces
//     besides Services and EndpointSlices; it runs as pki.ProxyUser, whose
//     default role (system:node-proxier) does not cover them;
//   - the API server reaches the kubelets (logs, exec, port-forward,
//     metrics) as pki.KubeletClientUser, with system:kubelet-api-admin's
//     rights, no more (not system:masters);
//   - the node IPAM (nodeipam.go) reads Nodes and sets their pod CIDRs as
//     pki.NodeIPAMUser.
var plinthRBAC = []rbacObject{
	{"/apis/rbac.authorization.k8s.io/v1/clusterroles/plinth:node-services", `{
  "apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRole",
  "metadata": {"name": "plinth:node-services"},
  "rules": [{"apiGroups": [""], "resources": ["namespaces"], "verbs": ["get", "list", "watch"]}]}`},
	clusterRoleBinding("plinth:node-services", "plinth:node-services", "User", pki.ProxyUser),
	clusterRoleBinding("plinth:apiserver-kubelet-client", "system:kubelet-api-admin", "User", pki.KubeletClientUser),
	{"/apis/rbac.authorization.k8s.io/v1/clusterroles/plinth:node-ipam", `{
  "apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRole",
  "metadata": {"name": "plinth:node-ipam"},
  "rules": [{"apiGroups": [""], "resources": ["nodes"], "verbs": ["get", "list", "watch", "patch"]}]}`},
	clusterRoleBinding("plinth:node-ipam", "plinth:node-ipam", "User", pki.NodeIPAMUser),
}

// OwnerBinding is the ClusterRoleBinding that makes the owner's current
// certificates (group pki.OwnerGroup(epoch)) cluster administrators.
// There is one, for the current epoch: applying it for a new epoch
// replaces its subject, and every certificate of the old epoch loses its
// rights at once.
const OwnerBinding = "plinth:owner"

// ownerBinding is OwnerBinding for epoch.
func ownerBinding(epoch uint64) rbacObject {
	return clusterRoleBinding(OwnerBinding, "cluster-admin", "Group", pki.OwnerGroup(epoch))
}

// clusterRoleBinding binds role to one subject of kind (User or Group).
func clusterRoleBinding(name, role, kind, subject string) rbacObject {
	return rbacObject{"/apis/rbac.authorization.k8s.io/v1/clusterrolebindings/" + name, `{
  "apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRoleBinding",
  "metadata": {"name": "` + name + `"},
  "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": "` + role + `"},
  "subjects": [{"apiGroup": "rbac.authorization.k8s.io", "kind": "` + kind + `", "name": "` + subject + `"}]}`}
}

// rbacValidity is how long the controller's own administrator
// certificate for applying plinthRBAC lives (it never leaves memory):
// the break-glass system:masters certificate of Plinth's own steps.
const rbacValidity = 10 * time.Minute

// applyRBAC is a runnable: it applies plinthRBAC and the owner's binding
// of the cluster policy's current epoch through the local API server
// with a short-lived administrator certificate, then applies the owner's
// binding again whenever the epoch changes (the owner revoked their
// certificates).
func applyRBAC(p *pki.PKI, nodeID, server string, policy *memory.Value[*clusterpb.ClusterConfiguration]) supervisor.Runnable {
	return func(ctx context.Context) error {
		pw := policy.Watch()
		defer pw.Close()
		cfg, err := pw.Get(ctx)
		if err != nil {
			return err
		}
		objects := append(slices.Clone(plinthRBAC), ownerBinding(cfg.GetKubernetesOwnerEpoch()))
		for {
			if err := applyObjects(ctx, p, nodeID, server, objects); err != nil {
				return err
			}
			supervisor.Logger(ctx).Info("applied Plinth's RBAC objects", "count", len(objects), "owner-epoch", cfg.GetKubernetesOwnerEpoch())
			supervisor.Signal(ctx, supervisor.SignalHealthy)
			epoch := cfg.GetKubernetesOwnerEpoch()
			for cfg.GetKubernetesOwnerEpoch() == epoch {
				if cfg, err = pw.Get(ctx); err != nil {
					return err
				}
			}
			objects = []rbacObject{ownerBinding(cfg.GetKubernetesOwnerEpoch())}
		}
	}
}

// applyObjects applies objects through server as a system:masters user
// of a certificate that lives rbacValidity in memory only: the break-glass
// user pki.ControllerPrefix+nodeID, which the audit log tells apart from
// the owner's (pki.OwnerPrefix).
func applyObjects(ctx context.Context, p *pki.PKI, nodeID, server string, objects []rbacObject) error {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return err
	}
	ca, cert, err := p.Admin(ctx, &key.PublicKey, nodeID, rbacValidity)
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
	for _, o := range objects {
		if err := serverSideApply(ctx, client, server+o.path, o.body); err != nil {
			return err
		}
	}
	return nil
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
