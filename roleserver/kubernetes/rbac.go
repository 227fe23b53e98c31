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
	"strconv"
	"strings"
	"time"

	"plinth.dev/plinth/api/clusterpb"
	"plinth.dev/plinth/platform/event/memory"
	"plinth.dev/plinth/platform/layout"
	"plinth.dev/plinth/platform/supervisor"
	"plinth.dev/plinth/roleserver/kubernetes/pki"
)

// rbacObject is one RBAC object Plinth keeps in the cluster, applied
// server-side (field manager "plinth"), so a change here reaches existing
// clusters on the next controller start.
type rbacObject struct {
	path, body string
	// ownersWin: applied without force, so a field the owner has
	// changed since (another default StorageClass) keeps their value.
	ownersWin bool
}

// plinthRBAC is what the API server's default roles do not give
// Plinth's own components:
//   - the DNS server (CoreDNS's kubernetes plugin) watches Namespaces
//     besides Services and EndpointSlices, and the network policy
//     enforcer (package netpol) Pods, Namespaces and NetworkPolicies; both
//     run as their node's user in pki.ProxyGroup (bound here to
//     system:node-proxier too; pki.ProxyUser, its shared predecessor, is
//     bound by the API server's defaults), whose role does not cover
//     them;
//   - the API server reaches the kubelets (logs, exec, port-forward,
//     metrics) as pki.KubeletClientUser, with system:kubelet-api-admin's
//     rights, no more (not system:masters);
//   - the node IPAM (nodeipam.go) reads Nodes and sets their pod CIDRs as
//     pki.NodeIPAMUser;
//   - every node's local volume provisioner (group pki.LocalVolumesGroup)
//     reads claims and StorageClasses, creates and deletes
//     PersistentVolumes (the local volume policy in admission.go holds
//     each to its own node's) and reports on claims with Events;
//   - the metrics servers (pki.MetricsServerUser, metrics.go) read Nodes
//     and Pods and the kubelets' resource metrics, and have the API
//     servers authenticate and authorize their callers
//     (system:auth-delegator); whoever may view a namespace may read its
//     pods' metrics (the role aggregated into view, edit and admin);
//
// and the default StorageClass "local" of those provisioners, applied so
// that the owner's changes to it (not the default any more) hold.
var plinthRBAC = []rbacObject{
	{path: "/apis/rbac.authorization.k8s.io/v1/clusterroles/plinth:node-services", body: `{
  "apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRole",
  "metadata": {"name": "plinth:node-services"},
  "rules": [
    {"apiGroups": [""], "resources": ["namespaces", "pods"], "verbs": ["get", "list", "watch"]},
    {"apiGroups": ["networking.k8s.io"], "resources": ["networkpolicies"], "verbs": ["get", "list", "watch"]}]}`},
	clusterRoleBinding("plinth:node-services", "plinth:node-services", "User", pki.ProxyUser),
	clusterRoleBinding("plinth:node-services:nodes", "plinth:node-services", "Group", pki.ProxyGroup),
	clusterRoleBinding("plinth:node-proxier", "system:node-proxier", "Group", pki.ProxyGroup),
	clusterRoleBinding("plinth:apiserver-kubelet-client", "system:kubelet-api-admin", "User", pki.KubeletClientUser),
	{path: "/apis/rbac.authorization.k8s.io/v1/clusterroles/plinth:node-ipam", body: `{
  "apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRole",
  "metadata": {"name": "plinth:node-ipam"},
  "rules": [{"apiGroups": [""], "resources": ["nodes"], "verbs": ["get", "list", "watch", "patch"]}]}`},
	clusterRoleBinding("plinth:node-ipam", "plinth:node-ipam", "User", pki.NodeIPAMUser),
	{path: "/apis/rbac.authorization.k8s.io/v1/clusterroles/plinth:local-volumes", body: `{
  "apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRole",
  "metadata": {"name": "plinth:local-volumes"},
  "rules": [
    {"apiGroups": [""], "resources": ["persistentvolumes"], "verbs": ["get", "list", "watch", "create", "delete"]},
    {"apiGroups": [""], "resources": ["persistentvolumeclaims"], "verbs": ["get", "list", "watch"]},
    {"apiGroups": ["storage.k8s.io"], "resources": ["storageclasses"], "verbs": ["get", "list", "watch"]},
    {"apiGroups": ["", "events.k8s.io"], "resources": ["events"], "verbs": ["create", "patch"]}]}`},
	clusterRoleBinding("plinth:local-volumes", "plinth:local-volumes", "Group", pki.LocalVolumesGroup),
	{path: "/apis/rbac.authorization.k8s.io/v1/clusterroles/plinth:metrics-server", body: `{
  "apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRole",
  "metadata": {"name": "plinth:metrics-server"},
  "rules": [
    {"apiGroups": [""], "resources": ["nodes/metrics"], "verbs": ["get"]},
    {"apiGroups": [""], "resources": ["nodes", "pods"], "verbs": ["get", "list", "watch"]}]}`},
	clusterRoleBinding("plinth:metrics-server", "plinth:metrics-server", "User", pki.MetricsServerUser),
	clusterRoleBinding("plinth:metrics-server:auth-delegator", "system:auth-delegator", "User", pki.MetricsServerUser),
	{path: "/apis/rbac.authorization.k8s.io/v1/clusterroles/plinth:metrics-reader", body: `{
  "apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRole",
  "metadata": {"name": "plinth:metrics-reader", "labels": {
    "rbac.authorization.k8s.io/aggregate-to-view": "true", "rbac.authorization.k8s.io/aggregate-to-edit": "true",
    "rbac.authorization.k8s.io/aggregate-to-admin": "true"}},
  "rules": [{"apiGroups": ["metrics.k8s.io"], "resources": ["pods", "nodes"], "verbs": ["get", "list", "watch"]}]}`},
	{path: "/apis/storage.k8s.io/v1/storageclasses/" + LocalStorageClass, ownersWin: true, body: `{
  "apiVersion": "storage.k8s.io/v1", "kind": "StorageClass",
  "metadata": {"name": "` + LocalStorageClass + `", "annotations": {"storageclass.kubernetes.io/is-default-class": "true"}},
  "provisioner": "` + layout.LocalVolumesProvisioner + `", "reclaimPolicy": "Delete", "volumeBindingMode": "WaitForFirstConsumer"}`},
}

// LocalStorageClass is the default StorageClass: a directory on the
// data volume of the node the pod is scheduled to, limited to the
// claim's size (the node's provisioner, kube local-volumes).
const LocalStorageClass = "local"

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
	return rbacObject{path: "/apis/rbac.authorization.k8s.io/v1/clusterrolebindings/" + name, body: `{
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
	client, err := adminClient(ctx, p, nodeID)
	if err != nil {
		return fmt.Errorf("certificate for applying Plinth's roles: %w", err)
	}
	defer client.CloseIdleConnections()
	for _, o := range objects {
		if err := serverSideApply(ctx, client, server+o.path, o.body, !o.ownersWin); err != nil {
			return err
		}
	}
	return nil
}

// adminClient is an HTTP client of the API servers as the break-glass
// user pki.ControllerPrefix+nodeID (system:masters), with a certificate
// that lives rbacValidity in memory only.
func adminClient(ctx context.Context, p *pki.PKI, nodeID string) (*http.Client, error) {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, err
	}
	ca, cert, err := p.Admin(ctx, &key.PublicKey, nodeID, rbacValidity)
	if err != nil {
		return nil, err
	}
	pool := x509.NewCertPool()
	pool.AddCert(ca)
	return &http.Client{Timeout: time.Minute, Transport: &http.Transport{TLSClientConfig: &tls.Config{
		RootCAs: pool, MinVersion: tls.VersionTLS12,
		Certificates: []tls.Certificate{{Certificate: [][]byte{cert.Raw}, PrivateKey: key}},
	}}}, nil
}

// serverSideApply PATCHes body to url as an apply patch; force takes
// the fields from any other manager, and without it a conflict (another
// manager changed a field of body) leaves theirs.
func serverSideApply(ctx context.Context, client *http.Client, url, body string, force bool) error {
	req, err := http.NewRequestWithContext(ctx, http.MethodPatch, url+"?fieldManager=plinth&force="+strconv.FormatBool(force), strings.NewReader(body))
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
	if !force && resp.StatusCode == http.StatusConflict {
		return nil
	}
	if resp.StatusCode != http.StatusOK && resp.StatusCode != http.StatusCreated {
		return fmt.Errorf("applying %s: %s: %s", url, resp.Status, b)
	}
	return nil
}
