//go:build built

package kubernetes

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"fmt"
	"net/http"
	"strings"
	"testing"
	"time"

	"plinth.dev/plinth/api/clusterpb"
	"plinth.dev/plinth/platform/event/memory"
	"plinth.dev/plinth/roleserver/consensus/client"
	"plinth.dev/plinth/roleserver/kubernetes/pki"
	"plinth.dev/plinth/roleserver/owner"
)

// testAdmissionAllowed is the allow list TestControlPlaneOnHost's
// controller runs with.
var testAdmissionAllowed = []string{"/data/volumes"}

// checkAdmission attacks the admission boundary of a real API server
// (TestControlPlaneOnHost's) as a user allowed to create pods would: in
// a namespace labelled privileged, a pod may use host paths, but none
// that is, holds or lies under node state or secrets (or /tmp), however
// the path is spelled; the owner's allow list opens a directory in the
// host volumes directory. In a
// namespace that says nothing, Pod Security's baseline refuses host
// paths and privileged containers, and restricted is warned of.
func checkAdmission(t *testing.T, ctx context.Context, kapi *owner.KubeAPI) {
	t.Helper()
	do := func(method, path, body string) (int, string, http.Header) {
		t.Helper()
		code, b, h, err := apiRequest(ctx, kapi, method, path, body)
		if err != nil {
			t.Fatalf("%s %s: %v", method, path, err)
		}
		return code, b, h
	}
	if code, b, _ := do("POST", "/api/v1/namespaces", `{"apiVersion":"v1","kind":"Namespace","metadata":{"name":"priv",
		"labels":{"pod-security.kubernetes.io/enforce":"privileged"}}}`); code != http.StatusCreated {
		t.Fatalf("creating a privileged namespace: %d %s", code, b)
	}
	// Pods need the namespace's default service account.
	for deadline := time.Now().Add(time.Minute); ; time.Sleep(200 * time.Millisecond) {
		if code, _, _ := do("GET", "/api/v1/namespaces/priv/serviceaccounts/default", ""); code == http.StatusOK {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("no default service account in the new namespace")
		}
	}
	n := 0
	pod := func(ns, volume, securityContext string) (int, string, http.Header) {
		n++
		spec := fmt.Sprintf(`{"containers":[{"name":"c","image":"plinth.dev/testpod:v1"%s}]%s}`, securityContext, volume)
		return do("POST", "/api/v1/namespaces/"+ns+"/pods", fmt.Sprintf(`{"apiVersion":"v1","kind":"Pod","metadata":{"name":"p%d"},"spec":%s}`, n, spec))
	}
	hostPath := func(p string) string { return fmt.Sprintf(`,"volumes":[{"name":"h","hostPath":{"path":%q}}]`, p) }

	for _, p := range []string{"/ephemeral/x", "/data", "//data", "/data/", "/./data", "/", "/var/run", "/var/run/x",
		"/var/lib/kubelet", "/var/lib/kubelet/pods", "/var/lib", "/var", "/etc", "/etc/hostname", "/etc/resolv.conf", "/run/plinth/esp", "/proc/1",
		"/dev", "/sys/kernel", "/var/log", "/data/volumesx"} {
		code, b, _ := pod("priv", hostPath(p), "")
		if code != http.StatusForbidden || !strings.Contains(b, hostPathsPolicyName) || !strings.Contains(b, "node state or secrets") {
			t.Errorf("a pod with host path %q in a privileged namespace: %d %s; want 403 from %s", p, code, b, hostPathsPolicyName)
		}
	}
	for _, p := range []string{"/data/volumes", "/data/volumes/x", "//data/volumes/./y/", "/usr/share", "/database", "/lib/modules", "/tmp", "/tmp/job-e2e/x",
		"/etc/hosts"} {
		if code, b, _ := pod("priv", hostPath(p), ""); code != http.StatusCreated {
			t.Errorf("a pod with host path %q (not protected, or allow-listed below %v) in a privileged namespace: %d %s", p, testAdmissionAllowed, code, b)
		}
	}
	// Several volumes: one protected path is enough to refuse the pod.
	if code, b, _ := pod("priv", `,"volumes":[{"name":"a","hostPath":{"path":"/usr/share"}},{"name":"b","hostPath":{"path":"/ephemeral"}}]`, ""); code != http.StatusForbidden {
		t.Errorf("a pod with one protected host path of two: %d %s", code, b)
	}

	// PersistentVolumes, hostPath or local, likewise.
	pv := func(name, source string) (int, string) {
		code, b, _ := do("POST", "/api/v1/persistentvolumes", fmt.Sprintf(`{"apiVersion":"v1","kind":"PersistentVolume","metadata":{"name":%q},
			"spec":{"capacity":{"storage":"1Gi"},"accessModes":["ReadWriteOnce"],%s,
			"nodeAffinity":{"required":{"nodeSelectorTerms":[{"matchExpressions":[{"key":"kubernetes.io/hostname","operator":"In","values":["x"]}]}]}}}}`, name, source))
		return code, b
	}
	if code, b := pv("pv-data", `"hostPath":{"path":"/data"}`); code != http.StatusForbidden || !strings.Contains(b, hostPathsPolicyName) {
		t.Errorf("a hostPath PersistentVolume of /data: %d %s", code, b)
	}
	if code, b := pv("pv-kubelet", `"local":{"path":"/var/lib/kubelet/x"}`); code != http.StatusForbidden || !strings.Contains(b, hostPathsPolicyName) {
		t.Errorf("a local PersistentVolume in /var/lib/kubelet: %d %s", code, b)
	}
	if code, b := pv("pv-allowed", `"local":{"path":"/data/volumes/pv1"}`); code != http.StatusCreated {
		t.Errorf("a local PersistentVolume in the allow-listed /data/volumes: %d %s", code, b)
	}

	// A namespace that says nothing: baseline. No host path at all, no
	// privileged container; restricted is warned of.
	if code, b, _ := pod("default", hostPath("/usr/share"), ""); code != http.StatusForbidden || !strings.Contains(b, `violates PodSecurity \"baseline:latest\"`) {
		t.Errorf("a pod with a host path in default: %d %s; want baseline's refusal", code, b)
	}
	if code, b, _ := pod("default", "", `,"securityContext":{"privileged":true}`); code != http.StatusForbidden || !strings.Contains(b, `violates PodSecurity \"baseline:latest\"`) {
		t.Errorf("a privileged pod in default: %d %s; want baseline's refusal", code, b)
	}
	code, b, h := pod("default", "", "")
	if code != http.StatusCreated || !strings.Contains(strings.Join(h.Values("Warning"), " "), `would violate PodSecurity \"restricted:latest\"`) {
		t.Errorf("a baseline pod in default: %d %s, warnings %q; want it created with restricted's warning", code, b, h.Values("Warning"))
	}
	// kube-system is exempt from Pod Security, not from the host paths.
	if code, b, _ := pod("kube-system", hostPath("/usr/share"), ""); code != http.StatusCreated {
		t.Errorf("a pod with an unprotected host path in kube-system: %d %s", code, b)
	}
	if code, b, _ := pod("kube-system", hostPath("/ephemeral"), ""); code != http.StatusForbidden || !strings.Contains(b, hostPathsPolicyName) {
		t.Errorf("a pod with host path /ephemeral in kube-system: %d %s", code, b)
	}
	// The static policy cannot be replaced through the API.
	if code, b, _ := do("DELETE", "/apis/admissionregistration.k8s.io/v1/validatingadmissionpolicies/"+hostPathsPolicyName, ""); code != http.StatusNotFound {
		t.Errorf("deleting the static host path policy: %d %s; want 404 (not an API object)", code, b)
	}
	if code, b, _ := do("POST", "/apis/admissionregistration.k8s.io/v1/validatingadmissionpolicies", `{"apiVersion":"admissionregistration.k8s.io/v1",
		"kind":"ValidatingAdmissionPolicy","metadata":{"name":"`+hostPathsPolicyName+`"},"spec":{"validations":[{"expression":"true"}]}}`); code < 400 {
		t.Errorf("creating an API policy of the static policy's name: %d %s", code, b)
	}
}

// checkSecretsAtRest: a Secret is stored encrypted (secretbox, the
// curator's key) inside etcd, not only by the disk; a rotation (a new
// key added, then activated: the control plane restarts with each)
// ends with every Secret rewritten under the new key, and the old one
// retired.
func checkSecretsAtRest(t *testing.T, ctx context.Context, kapi *owner.KubeAPI, raw client.Namespaced, p *pki.PKI, nodeID string) {
	t.Helper()
	if code, b := kapiDo(t, ctx, kapi, "POST", "/api/v1/namespaces/default/secrets", `{"apiVersion":"v1","kind":"Secret",
		"metadata":{"name":"s1"},"stringData":{"password":"hunter2"}}`); code != http.StatusCreated {
		t.Fatalf("creating a Secret: %d %s", code, b)
	}
	stored := func() string {
		t.Helper()
		r, err := raw.Get(ctx, "/registry/secrets/default/s1")
		if err != nil || len(r.Kvs) != 1 {
			t.Fatalf("the Secret in etcd: %v, %v", r, err)
		}
		return string(r.Kvs[0].Value)
	}
	if v := stored(); !strings.HasPrefix(v, "k8s:enc:secretbox:v1:key-1:") || strings.Contains(v, "hunter2") {
		t.Fatalf("the Secret is not encrypted with key-1 in etcd: %q", v[:min(len(v), 60)])
	}
	waitLoaded := func(gen uint64) {
		t.Helper()
		for deadline := time.Now().Add(2 * time.Minute); ; time.Sleep(500 * time.Millisecond) {
			if l, err := p.SecretsLoaded(ctx); err == nil && l[nodeID] >= gen {
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("the control plane does not run with key generation %d", gen)
			}
		}
		// Serving again (the readiness check of the restart).
		for deadline := time.Now().Add(time.Minute); ; time.Sleep(500 * time.Millisecond) {
			if code, _ := kapiDo(t, ctx, kapi, "GET", "/api/v1/namespaces/default/secrets/s1", ""); code == http.StatusOK {
				return
			}
			if time.Now().After(deadline) {
				t.Fatal("the API server does not serve the Secret after its restart")
			}
		}
	}
	for _, step := range []string{pki.RotateAdd, pki.RotateActivate} {
		k, err := p.RotateSecretsKeys(ctx, step)
		if err != nil {
			t.Fatal(err)
		}
		waitLoaded(k.Generation)
	}
	if n, err := kapi.RewriteSecrets(ctx); err != nil || n < 1 {
		t.Fatalf("rewriting the Secrets: %d, %v", n, err)
	}
	if v := stored(); !strings.HasPrefix(v, "k8s:enc:secretbox:v1:key-2:") {
		t.Fatalf("the rewritten Secret is not encrypted with key-2: %q", v[:min(len(v), 60)])
	}
	k, err := p.RotateSecretsKeys(ctx, pki.RotateRetire)
	if err != nil {
		t.Fatal(err)
	}
	waitLoaded(k.Generation)
	if code, b := kapiDo(t, ctx, kapi, "GET", "/api/v1/namespaces/default/secrets/s1", ""); code != http.StatusOK || !strings.Contains(b, "aHVudGVyMg==") {
		t.Fatalf("the Secret after the old key's retirement: %d %s", code, b)
	}
}

func kapiDo(t *testing.T, ctx context.Context, k *owner.KubeAPI, method, path, body string) (int, string) {
	t.Helper()
	code, b, _, err := apiRequest(ctx, k, method, path, body)
	if err != nil {
		return 0, err.Error()
	}
	return code, b
}

// checkOwnerRevocation: the owner's certificates work through the
// controller's binding of their epoch's group to cluster-admin, and a new
// epoch in the cluster policy (plinthctl cluster kubeconfig --revoke-all)
// rebinds it, so a certificate of the old epoch is refused at once and
// one of the new works.
func checkOwnerRevocation(t *testing.T, ctx context.Context, server string, ca *x509.Certificate, p *pki.PKI, policy *memory.Value[*clusterpb.ClusterConfiguration]) {
	t.Helper()
	ownerAPI := func(epoch uint64) *owner.KubeAPI {
		t.Helper()
		key, _ := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
		kca, cert, err := p.Owner(ctx, key.Public(), epoch, time.Hour)
		if err != nil || !kca.Equal(ca) {
			t.Fatalf("an owner certificate of epoch %d: %v", epoch, err)
		}
		return owner.NewKubeAPI(&owner.KubernetesCredentials{CA: kca, Certificate: cert}, key, strings.TrimPrefix(server, "https://"))
	}
	until := func(what string, k *owner.KubeAPI, want int) {
		t.Helper()
		for deadline := time.Now().Add(time.Minute); ; time.Sleep(200 * time.Millisecond) {
			code, _ := kapiDo(t, ctx, k, "GET", "/api/v1/namespaces/default", "")
			if code == want {
				return
			}
			if time.Now().After(deadline) {
				t.Fatalf("%s: %d, want %d", what, code, want)
			}
		}
	}
	old := ownerAPI(0)
	until("an owner certificate of epoch 0", old, http.StatusOK)
	// The same admission policy (a change of it would restart the control
	// plane), a new epoch.
	policy.Set(&clusterpb.ClusterConfiguration{Kubernetes: &clusterpb.KubernetesPolicy{AllowedHostPaths: testAdmissionAllowed}, KubernetesOwnerEpoch: 1})
	until("the revoked owner certificate of epoch 0", old, http.StatusForbidden)
	until("an owner certificate of epoch 1", ownerAPI(1), http.StatusOK)
}
