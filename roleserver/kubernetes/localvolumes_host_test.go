//go:build built

package kubernetes

import (
	"context"
	"crypto/ed25519"
	"crypto/rand"
	"fmt"
	"net/http"
	"strings"
	"testing"
	"time"

	"plinth.dev/plinth/platform/layout"
	"plinth.dev/plinth/roleserver/kubernetes/pki"
	"plinth.dev/plinth/roleserver/owner"
)

// checkLocalVolumes attacks the local volume boundary of a real API
// server (TestControlPlaneOnHost's) as a node's stolen provisioner
// credentials would: the provisioner of node-a makes and deletes local
// volumes of node-a in layout.LocalVolumesDir, and nothing else: no
// volume of node-b, no path outside its directory or not its volume's
// own, no hostPath volume, no other node's volume deleted, no Secret
// read. An administrator cannot make a local volume in that directory
// either (node state: the host path policy), but can change one the
// provisioner made. The default StorageClass is the provisioners'. Once
// a node is decommissioned, the controller deletes its volumes, bound
// ones too, and their claims go Lost.
func checkLocalVolumes(t *testing.T, ctx context.Context, admin *owner.KubeAPI, p *pki.PKI, server string, decommission func(ids ...string)) {
	t.Helper()
	provisioner := func(node string) *owner.KubeAPI {
		t.Helper()
		pub, key, _ := ed25519.GenerateKey(rand.Reader)
		ca, cert, err := p.LocalVolumes(ctx, node, pub)
		if err != nil {
			t.Fatal(err)
		}
		return owner.NewKubeAPI(&owner.KubernetesCredentials{CA: ca, Certificate: cert}, key, strings.TrimPrefix(server, "https://"))
	}
	a, b := provisioner("node-a"), provisioner("node-b")
	pv := func(name, node, source, annotations string) string {
		return fmt.Sprintf(`{"apiVersion":"v1","kind":"PersistentVolume","metadata":{"name":%q,"annotations":{%s}},
			"spec":{"capacity":{"storage":"1Gi"},"accessModes":["ReadWriteOnce"],"storageClassName":"local",%s,
			"nodeAffinity":{"required":{"nodeSelectorTerms":[{"matchExpressions":[{"key":"kubernetes.io/hostname","operator":"In","values":[%q]}]}]}}}}`,
			name, annotations, source, node)
	}
	ours := `"pv.kubernetes.io/provisioned-by":"` + layout.LocalVolumesProvisioner + `"`
	local := func(name string) string { return fmt.Sprintf(`"local":{"path":%q}`, layout.LocalVolumesDir+"/"+name) }

	// The RBAC objects are applied by the controller as it starts.
	for deadline := time.Now().Add(time.Minute); ; time.Sleep(time.Second) {
		code, body := kapiDo(t, ctx, a, "POST", "/api/v1/persistentvolumes", pv("pvc-a1", "node-a", local("pvc-a1"), ours))
		if code == http.StatusCreated {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("node-a's provisioner creating its own volume: %d %s", code, body)
		}
	}
	for _, tc := range []struct{ what, body, want string }{
		{"a volume of another node", pv("pvc-a2", "node-b", local("pvc-a2"), ours), "bound to node node-a"},
		{"a volume of two nodes", strings.Replace(pv("pvc-a2", "node-a", local("pvc-a2"), ours), `"values":["node-a"]`, `"values":["node-a","node-b"]`, 1), "bound to node node-a"},
		{"a volume at another volume's path", pv("pvc-a2", "node-a", local("pvc-a1"), ours), localVolumesPolicyName},
		{"a volume in the node's state", pv("pvc-a2", "node-a", `"local":{"path":"/data/etcd"}`, ours), localVolumesPolicyName},
		{"a volume in the host volumes", pv("pvc-a2", "node-a", `"local":{"path":"/data/volumes/pvc-a2"}`, ours), localVolumesPolicyName},
		{"a hostPath volume", pv("pvc-a2", "node-a", `"hostPath":{"path":"`+layout.LocalVolumesDir+`/pvc-a2"}`, ours), localVolumesPolicyName},
		{"a volume not marked as its own", pv("pvc-a2", "node-a", local("pvc-a2"), ""), localVolumesPolicyName},
	} {
		// Either policy may answer first where both refuse.
		code, body := kapiDo(t, ctx, a, "POST", "/api/v1/persistentvolumes", tc.body)
		if code != http.StatusForbidden || !strings.Contains(body, tc.want) && !(tc.want == localVolumesPolicyName && strings.Contains(body, hostPathsPolicyName)) {
			t.Errorf("node-a's provisioner creating %s: %d %s; want 403 naming %q", tc.what, code, body, tc.want)
		}
	}
	if code, body := kapiDo(t, ctx, a, "GET", "/api/v1/namespaces/kube-system/secrets", ""); code != http.StatusForbidden {
		t.Errorf("node-a's provisioner listing Secrets: %d %s", code, body)
	}
	if code, body := kapiDo(t, ctx, b, "DELETE", "/api/v1/persistentvolumes/pvc-a1", ""); code != http.StatusForbidden || !strings.Contains(body, "node-b") {
		t.Errorf("node-b's provisioner deleting node-a's volume: %d %s", code, body)
	}
	// An administrator: no new local volume in the directory, but the
	// PV controller's and the owner's changes to one made there.
	if code, body := kapiDo(t, ctx, admin, "POST", "/api/v1/persistentvolumes", pv("pvc-admin", "node-a", local("pvc-admin"), ours)); code != http.StatusForbidden ||
		!strings.Contains(body, hostPathsPolicyName) {
		t.Errorf("an administrator creating a local volume in %s: %d %s", layout.LocalVolumesDir, code, body)
	}
	if code, body := kapiDo(t, ctx, admin, "PATCH", "/api/v1/persistentvolumes/pvc-a1", `{"metadata":{"labels":{"owner":"x"}}}`); code != http.StatusOK {
		t.Errorf("an administrator labelling a provisioned volume: %d %s", code, body)
	}
	if code, body := kapiDo(t, ctx, a, "DELETE", "/api/v1/persistentvolumes/pvc-a1", ""); code != http.StatusOK {
		t.Errorf("node-a's provisioner deleting its own volume: %d %s", code, body)
	}
	// A decommissioned node's volumes go, a bound one too (past its
	// protection finalizer); its claim is Lost. Another node's stays.
	gone := provisioner("node-gone")
	for _, c := range []struct {
		api        *owner.KubeAPI
		name, node string
	}{{gone, "pvc-g1", "node-gone"}, {gone, "pvc-g2", "node-gone"}, {b, "pvc-b1", "node-b"}} {
		if code, body := kapiDo(t, ctx, c.api, "POST", "/api/v1/persistentvolumes", pv(c.name, c.node, local(c.name), ours)); code != http.StatusCreated {
			t.Fatalf("%s's provisioner creating %s: %d %s", c.node, c.name, code, body)
		}
	}
	if code, body := kapiDo(t, ctx, admin, "POST", "/api/v1/namespaces/default/persistentvolumeclaims", `{"apiVersion":"v1","kind":"PersistentVolumeClaim",
		"metadata":{"name":"on-gone"},"spec":{"accessModes":["ReadWriteOnce"],"storageClassName":"local","volumeName":"pvc-g1",
		"resources":{"requests":{"storage":"1Gi"}}}}`); code != http.StatusCreated {
		t.Fatalf("a claim of pvc-g1: %d %s", code, body)
	}
	claimPhase := func() string {
		_, body := kapiDo(t, ctx, admin, "GET", "/api/v1/namespaces/default/persistentvolumeclaims/on-gone", "")
		if i := strings.Index(body, `"phase":"`); i >= 0 {
			return strings.SplitN(body[i+len(`"phase":"`):], `"`, 2)[0]
		}
		return ""
	}
	for deadline := time.Now().Add(time.Minute); claimPhase() != "Bound"; time.Sleep(time.Second) {
		if time.Now().After(deadline) {
			t.Fatalf("the claim of pvc-g1 is %q, not Bound", claimPhase())
		}
	}
	decommission("node-gone")
	for deadline := time.Now().Add(time.Minute); ; time.Sleep(time.Second) {
		c1, _ := kapiDo(t, ctx, admin, "GET", "/api/v1/persistentvolumes/pvc-g1", "")
		c2, _ := kapiDo(t, ctx, admin, "GET", "/api/v1/persistentvolumes/pvc-g2", "")
		if c1 == http.StatusNotFound && c2 == http.StatusNotFound && claimPhase() == "Lost" {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("after node-gone's decommission: its volumes %d %d (want 404), its claim %q (want Lost)", c1, c2, claimPhase())
		}
	}
	if code, body := kapiDo(t, ctx, admin, "GET", "/api/v1/persistentvolumes/pvc-b1", ""); code != http.StatusOK {
		t.Errorf("node-b's volume after node-gone's decommission: %d %s", code, body)
	}

	code, body := kapiDo(t, ctx, admin, "GET", "/apis/storage.k8s.io/v1/storageclasses/"+LocalStorageClass, "")
	if code != http.StatusOK || !strings.Contains(body, `"storageclass.kubernetes.io/is-default-class":"true"`) ||
		!strings.Contains(body, `"provisioner":"`+layout.LocalVolumesProvisioner+`"`) || !strings.Contains(body, `"volumeBindingMode":"WaitForFirstConsumer"`) {
		t.Errorf("the default StorageClass: %d %s", code, body)
	}
}
