//go:build built

package kubernetes

import (
	"context"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"

	"plinth.dev/plinth/roleserver/kubernetes/pki"
	"plinth.dev/plinth/roleserver/owner"
)

// checkTenantAdmission attacks the real API server (TestControlPlaneOnHost's)
// as tenants would, each with only the rights named, impersonated by the
// break-glass administrator:
//   - with edit in its namespace, a Service whose external IP is the
//     node's address (which would capture the node's own connections to
//     its API server and curator) is refused; one without is created;
//   - with create on namespaces, a namespace labelled privileged is
//     refused, a plain one created;
//   - with patch on namespaces and admin in its own, labelling it
//     privileged (through the namespace, its status or its finalize
//     subresource) or pinning its Pod Security version is refused;
//   - the owner (the group of its epoch, bound to cluster-admin) and
//     whom RBAC lets use the privileged level create privileged
//     namespaces.
func checkTenantAdmission(t *testing.T, ctx context.Context, kapi *owner.KubeAPI, node net.IP) {
	t.Helper()
	as := func(user string, groups ...string) func(method, path, body string) (int, string) {
		return func(method, path, body string) (int, string) {
			t.Helper()
			h := http.Header{"Impersonate-User": {user}, "Impersonate-Group": append([]string{"system:authenticated"}, groups...)}
			code, b, _, err := apiRequestWith(ctx, kapi, method, path, body, h)
			if err != nil {
				t.Fatalf("%s %s as %s: %v", method, path, user, err)
			}
			return code, b
		}
	}
	admin := as("plinth-test-admin", "system:masters")
	must := func(method, path, body string) {
		t.Helper()
		if code, b := admin(method, path, body); code >= 300 {
			t.Fatalf("%s %s: %d %s", method, path, code, b)
		}
	}
	// The tenants' rights.
	must("POST", "/api/v1/namespaces", `{"apiVersion":"v1","kind":"Namespace","metadata":{"name":"tenant"}}`)
	must("POST", "/api/v1/namespaces", `{"apiVersion":"v1","kind":"Namespace","metadata":{"name":"patcher"}}`)
	binding := func(ns, name, role, user string) {
		kind, path := "RoleBinding", "/apis/rbac.authorization.k8s.io/v1/namespaces/"+ns+"/rolebindings"
		roleKind := "ClusterRole"
		if ns == "" {
			kind, path = "ClusterRoleBinding", "/apis/rbac.authorization.k8s.io/v1/clusterrolebindings"
		}
		must("POST", path, `{"apiVersion":"rbac.authorization.k8s.io/v1","kind":"`+kind+`","metadata":{"name":"`+name+`"},
			"roleRef":{"apiGroup":"rbac.authorization.k8s.io","kind":"`+roleKind+`","name":"`+role+`"},
			"subjects":[{"apiGroup":"rbac.authorization.k8s.io","kind":"User","name":"`+user+`"}]}`)
	}
	clusterRole := func(name, rules string) {
		must("POST", "/apis/rbac.authorization.k8s.io/v1/clusterroles", `{"apiVersion":"rbac.authorization.k8s.io/v1","kind":"ClusterRole",
			"metadata":{"name":"`+name+`"},"rules":`+rules+`}`)
	}
	binding("tenant", "tenant-edit", "edit", "tenant")
	clusterRole("ns-creator", `[{"apiGroups":[""],"resources":["namespaces"],"verbs":["create","get"]}]`)
	binding("", "ns-creator", "ns-creator", "creator")
	clusterRole("ns-patcher", `[{"apiGroups":[""],"resources":["namespaces","namespaces/status","namespaces/finalize"],"verbs":["get","patch","update"]}]`)
	binding("", "ns-patcher", "ns-patcher", "patcher")
	binding("patcher", "patcher-admin", "admin", "patcher")
	clusterRole("privileged-user", `[{"apiGroups":["`+podSecurityLevelsGroup+`"],"resources":["`+podSecurityLevelsResource+`"],"resourceNames":["privileged"],"verbs":["use"]}]`)
	binding("", "delegate", "privileged-user", "delegate")
	binding("", "delegate-ns", "ns-creator", "delegate")

	refused := func(what string, code int, b, policy string) {
		t.Helper()
		if code != http.StatusForbidden || !strings.Contains(b, policy) {
			t.Errorf("%s: %d %s; want 403 from %s", what, code, b, policy)
		}
	}
	created := func(what string, code int, b string) {
		t.Helper()
		if code != http.StatusCreated && code != http.StatusOK {
			t.Errorf("%s: %d %s; want it done", what, code, b)
		}
	}
	// RBAC (an informer's cache) may take a moment to know the bindings.
	tenant := as("tenant")
	service := func(name, ips string) string {
		return `{"apiVersion":"v1","kind":"Service","metadata":{"name":"` + name + `"},"spec":{"ports":[{"name":"a","port":6443},{"name":"b","port":7835}]` + ips + `}}`
	}
	code, b := retryUntil(t, func() (int, string) {
		return tenant("POST", "/api/v1/namespaces/tenant/services", service("plain", ""))
	}, http.StatusForbidden)
	created("a tenant's Service without external IPs", code, b)
	code, b = tenant("POST", "/api/v1/namespaces/tenant/services", service("capture", `,"externalIPs":["`+node.String()+`"]`))
	refused("a tenant's Service with the node's address as external IP", code, b, externalIPsPolicyName)
	code, b = tenant("PATCH", "/api/v1/namespaces/tenant/services/plain", `{"spec":{"externalIPs":["`+node.String()+`"]}}`)
	refused("a tenant adding the node's address to a Service", code, b, externalIPsPolicyName)

	creator := as("creator")
	priv := func(name string) string {
		return `{"apiVersion":"v1","kind":"Namespace","metadata":{"name":"` + name + `","labels":{"` + enforceLabel + `":"privileged"}}}`
	}
	code, b = retryUntil(t, func() (int, string) { return creator("POST", "/api/v1/namespaces", priv("mine")) }, http.StatusForbidden, func(b string) bool {
		return strings.Contains(b, "cannot create resource")
	})
	refused("a privileged namespace by a user who may create namespaces", code, b, podSecurityLabelsPolicyName)
	code, b = creator("POST", "/api/v1/namespaces", `{"apiVersion":"v1","kind":"Namespace","metadata":{"name":"mine"}}`)
	created("a plain namespace by a user who may create namespaces", code, b)

	patcher := as("patcher")
	label := `{"metadata":{"labels":{"` + enforceLabel + `":"privileged"}}}`
	for _, sub := range []string{"", "/status"} {
		code, b = retryUntil(t, func() (int, string) { return patcher("PATCH", "/api/v1/namespaces/patcher"+sub, label) }, http.StatusForbidden, func(b string) bool {
			return strings.Contains(b, "cannot patch resource")
		})
		refused("labelling its namespace privileged through namespaces"+sub, code, b, podSecurityLabelsPolicyName)
	}
	// finalize takes a whole Namespace (PUT).
	code, b = patcher("PUT", "/api/v1/namespaces/patcher/finalize", priv("patcher"))
	refused("labelling its namespace privileged through namespaces/finalize", code, b, podSecurityLabelsPolicyName)
	code, b = patcher("PATCH", "/api/v1/namespaces/patcher", `{"metadata":{"labels":{"`+enforceVersionLabel+`":"v1.24"}}}`)
	refused("pinning its namespace's Pod Security version", code, b, podSecurityLabelsPolicyName)
	code, b = patcher("PATCH", "/api/v1/namespaces/patcher", `{"metadata":{"labels":{"`+enforceLabel+`":"restricted"}}}`)
	created("tightening its namespace to restricted", code, b)

	code, b = as("plinth-owner:1", pki.OwnerGroup(0))("POST", "/api/v1/namespaces", priv("owners"))
	created("a privileged namespace by the owner", code, b)
	code, b = retryUntil(t, func() (int, string) { return as("delegate")("POST", "/api/v1/namespaces", priv("delegated")) }, http.StatusForbidden)
	created("a privileged namespace by whom RBAC lets use privileged", code, b)
}

// retryUntil calls f until it answers other than with code (or with code
// but a body none of also matches), for a while: what RBAC's informers
// have not seen yet is forbidden.
func retryUntil(t *testing.T, f func() (int, string), code int, also ...func(string) bool) (int, string) {
	t.Helper()
	for i := 0; ; i++ {
		c, b := f()
		transient := c == code && (len(also) == 0 || also[0](b))
		if !transient || i == 50 {
			return c, b
		}
		time.Sleep(100 * time.Millisecond)
	}
}
