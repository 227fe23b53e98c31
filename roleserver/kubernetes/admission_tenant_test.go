package kubernetes

import (
	"strings"
	"testing"

	"k8s.io/apiserver/pkg/authorization/authorizer"
)

// TestExternalIPsPolicy: a Service naming a new external IP is refused
// unless the owner's ranges hold it (IPv4 and IPv6); what an update
// keeps passes, as DenyServiceExternalIPs lets it; the refusal names
// the address and the policy.
func TestExternalIPsPolicy(t *testing.T) {
	svc := func(ips ...string) map[string]any {
		a := []any{}
		for _, ip := range ips {
			a = append(a, ip)
		}
		spec := map[string]any{"ports": []any{map[string]any{"port": 6443}}}
		if ips != nil {
			spec["externalIPs"] = a
		}
		return map[string]any{"kind": "Service", "spec": spec}
	}
	none := externalIPsPolicy(nil)
	ranges := externalIPsPolicy([]string{"192.0.2.0/28", "2001:db8::/64"})
	for _, c := range []struct {
		what        string
		policy      []byte
		object, old map[string]any
		want        bool
	}{
		{"no external IP", none, svc(), nil, true},
		{"a node's address, none allowed", none, svc("10.0.2.15"), nil, false},
		{"an empty list", none, svc([]string{}...), nil, true},
		{"an address in an allowed range", ranges, svc("192.0.2.14"), nil, true},
		{"an IPv6 address in an allowed range", ranges, svc("2001:db8::7"), nil, true},
		{"one address outside the ranges of two", ranges, svc("192.0.2.1", "192.0.2.16"), nil, false},
		{"an update keeping its address", none, svc("10.0.2.15"), svc("10.0.2.15"), true},
		{"an update adding an address", none, svc("10.0.2.15", "10.0.2.16"), svc("10.0.2.15"), false},
		{"an update dropping it", none, svc(), svc("10.0.2.15"), true},
	} {
		r := evalPolicy(t, c.policy, policyRequest{object: c.object, old: c.old, user: "tenant"})
		if r.ok != c.want {
			t.Errorf("%s: admitted %v, want %v (%s)", c.what, r.ok, c.want, r.message)
		}
		if !r.ok && (!strings.Contains(r.message, externalIPsPolicyName) || !strings.Contains(r.message, "10.0.2.1") && !strings.Contains(r.message, "192.0.2.16")) {
			t.Errorf("%s: the refusal does not name the address and the policy: %s", c.what, r.message)
		}
	}
}

// TestPodSecurityLabelsPolicy: a namespace created with, or changed to,
// an enforce level looser than the cluster default and than what it had
// is refused unless the requester may "use" that level; a pinned
// enforce-version unless they may "pin" it. Tightening, keeping a level
// the owner gave, labels that enforce nothing and a level Pod Security
// cannot parse (it enforces restricted then) pass.
func TestPodSecurityLabelsPolicy(t *testing.T) {
	ns := func(labels ...string) map[string]any {
		l := map[string]any{}
		for i := 0; i+1 < len(labels); i += 2 {
			l[labels[i]] = labels[i+1]
		}
		return map[string]any{"kind": "Namespace", "metadata": map[string]any{"name": "n", "labels": l}}
	}
	owner := func(a authorizer.Attributes) bool { return true }
	delegate := func(a authorizer.Attributes) bool {
		return a.GetAPIGroup() == podSecurityLevelsGroup && a.GetResource() == podSecurityLevelsResource && a.GetName() == "privileged" && a.GetVerb() == "use"
	}
	baseline, restricted := podSecurityLabelsPolicy("baseline"), podSecurityLabelsPolicy("restricted")
	for _, c := range []struct {
		what        string
		policy      []byte
		object, old map[string]any
		allow       func(authorizer.Attributes) bool
		want        bool
	}{
		{"a plain namespace", baseline, ns(), nil, nil, true},
		{"a privileged namespace by a tenant", baseline, ns(enforceLabel, "privileged"), nil, nil, false},
		{"a privileged namespace by the owner", baseline, ns(enforceLabel, "privileged"), nil, owner, true},
		{"a privileged namespace by whom the owner let use privileged", baseline, ns(enforceLabel, "privileged"), nil, delegate, true},
		{"a tenant's label change to privileged", baseline, ns(enforceLabel, "privileged"), ns(), nil, false},
		{"a tenant's label change from restricted to privileged", baseline, ns(enforceLabel, "privileged"), ns(enforceLabel, "restricted"), nil, false},
		{"a tenant's other label on a privileged namespace", baseline, ns(enforceLabel, "privileged", "team", "a"), ns(enforceLabel, "privileged"), nil, true},
		{"a tenant tightening a privileged namespace", baseline, ns(enforceLabel, "restricted"), ns(enforceLabel, "privileged"), nil, true},
		{"a tenant's restricted namespace", baseline, ns(enforceLabel, "restricted"), nil, nil, true},
		{"a tenant's explicit baseline", baseline, ns(enforceLabel, "baseline"), nil, nil, true},
		{"a level Pod Security cannot parse", baseline, ns(enforceLabel, "Privileged"), nil, nil, true},
		{"warn and audit labels", baseline, ns("pod-security.kubernetes.io/warn", "privileged", "pod-security.kubernetes.io/audit", "privileged"), nil, nil, true},
		{"a baseline namespace where restricted is the default", restricted, ns(enforceLabel, "baseline"), nil, nil, false},
		{"a baseline namespace where restricted is the default, by the owner", restricted, ns(enforceLabel, "baseline"), nil, owner, true},
		{"dropping restricted's label where it is the default", restricted, ns(), ns(enforceLabel, "restricted"), nil, true},
		{"a tenant dropping a baseline label where restricted is the default", restricted, ns(), ns(enforceLabel, "baseline"), nil, true},
		{"a pinned version by a tenant", baseline, ns(enforceVersionLabel, "v1.24"), nil, nil, false},
		{"a pinned version by the owner", baseline, ns(enforceVersionLabel, "v1.24"), nil, owner, true},
		{"a pinned version by who may only use privileged", baseline, ns(enforceVersionLabel, "v1.24"), nil, delegate, false},
		{"a tenant re-pinning a pinned version", baseline, ns(enforceVersionLabel, "v1.20"), ns(enforceVersionLabel, "v1.24"), nil, false},
		{"a tenant keeping a pinned version", baseline, ns(enforceVersionLabel, "v1.24", "team", "a"), ns(enforceVersionLabel, "v1.24"), nil, true},
		{"a tenant unpinning", baseline, ns(enforceVersionLabel, "latest"), ns(enforceVersionLabel, "v1.24"), nil, true},
		{"latest by a tenant", baseline, ns(enforceVersionLabel, "latest"), nil, nil, true},
	} {
		r := evalPolicy(t, c.policy, policyRequest{object: c.object, old: c.old, user: "tenant", allow: c.allow})
		if r.ok != c.want {
			t.Errorf("%s: admitted %v, want %v (%s)", c.what, r.ok, c.want, r.message)
		}
		if !r.ok && !strings.Contains(r.message, podSecurityLabelsPolicyName) {
			t.Errorf("%s: the refusal does not name the policy: %s", c.what, r.message)
		}
	}
}
