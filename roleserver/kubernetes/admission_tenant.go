package kubernetes

import (
	"strconv"
	"strings"
)

// What a tenant may not do to the cluster, however its RBAC reads
// (admission.go lists every static policy):
//
//	Service  spec.externalIPs ─► plinth-external-ips: a new address outside
//	                             the owner's ranges is refused
//	Namespace pod-security.kubernetes.io/enforce{,-version}
//	          (namespaces, namespaces/status, namespaces/finalize)
//	                          ─► plinth-pod-security-labels: looser than the
//	                             cluster default, or a pinned version, only
//	                             with "use"/"pin" on podsecuritylevels/<level>
//
// Why externalIPs: kube-proxy sends the nodes' own new connections to a
// Service's external IP into the Service (CVE-2020-8554). A tenant with
// edit in one namespace naming a node's address and ports 6443, 7834 and
// 7835 in a Service without endpoints cut every node and the owner off
// the API server, the curator and etcd, and the Service came back with
// every reboot. Upstream's DenyServiceExternalIPs plugin refuses every
// address, and a static policy takes no parameters, so the owner's
// ranges are generated into the manifest, which the control plane
// reloads when the policy changes.
//
// Why the labels: Pod Security reads a namespace's level from its
// labels, which anyone who may create or patch a namespace writes. A
// privileged pod on a consensus member holds every key of the cluster
// (the decrypted data volume under /dev/mapper, every process's root
// with hostPID). The check is an authorization, not a group name: the
// owner's group changes with its epoch, cluster-admin (the owner) and
// system:masters (Plinth's controller) pass it, and the owner may
// delegate it with RBAC. Guarded by TestControlPlaneOnHost
// (checkTenantAdmission) and TestKubernetesTwoNodes (attackAsTenants).

// The virtual resource whose "use" (a looser level) and "pin" (an
// enforce-version other than latest) verbs the namespace label policy
// asks the authorizer about, named by the level. No such API exists;
// RBAC rules name it all the same:
//
//	rules: [{apiGroups: [security.plinth.dev], resources: [podsecuritylevels],
//	         resourceNames: [privileged], verbs: [use]}]
const (
	podSecurityLevelsGroup    = "security.plinth.dev"
	podSecurityLevelsResource = "podsecuritylevels"
)

// The Pod Security labels the namespace policy guards.
const (
	enforceLabel        = "pod-security.kubernetes.io/enforce"
	enforceVersionLabel = "pod-security.kubernetes.io/enforce-version"
)

// externalIPsPolicy refuses a Service whose spec.externalIPs names an
// address it did not name before (an update keeps what it had, as
// DenyServiceExternalIPs does) that lies in none of allowed (CIDRs,
// checked by clusterpb.CheckExternalIPRange).
func externalIPsPolicy(allowed []string) []byte {
	var q []string
	for _, c := range allowed {
		q = append(q, strconv.Quote(c))
	}
	return staticPolicy(externalIPsPolicyName, map[string]any{
		"failurePolicy": "Fail",
		"matchConstraints": map[string]any{"resourceRules": []any{map[string]any{
			"apiGroups": []string{""}, "apiVersions": []string{"v1"}, "operations": []string{"CREATE", "UPDATE"},
			"resources": []string{"services"},
		}}},
		"variables": []any{
			map[string]string{"name": "allowed", "expression": "[" + strings.Join(q, ", ") + "]"},
			map[string]string{"name": "had", "expression": `oldObject == null ? [] : oldObject.spec.?externalIPs.orValue([])`},
			map[string]string{"name": "refused", "expression": `object.spec.?externalIPs.orValue([]).filter(a, !(a in variables.had) && ` +
				`!(isIP(a) && variables.allowed.exists(c, cidr(c).containsIP(ip(a)))))`},
		},
		"validations": []any{map[string]any{
			"expression": "size(variables.refused) == 0",
			"messageExpression": `'external IP ' + variables.refused.join(', ') + ' refused by Plinth\'s external IP policy (` + externalIPsPolicyName +
				`): a Service\'s external IP captures the nodes\' own connections to that address; the cluster owner can allow ranges in the cluster policy' + ` +
				`(size(variables.allowed) == 0 ? ' (none allowed now)' : ' (allowed now: ' + variables.allowed.join(', ') + ')')`,
			"reason": "Forbidden",
		}},
	})
}

// podSecurityLabelsPolicy refuses a namespace created with, or changed
// to, a Pod Security enforce level looser than what it had (a new one:
// the cluster default, level) and looser than level, or an
// enforce-version other than what it had or "latest", unless the
// requester may "use" (a level) or "pin" (a version) the level on
// podSecurityLevelsResource. Looser: privileged < baseline < restricted;
// any other value ranks as restricted, which Pod Security enforces for
// a label it cannot parse.
func podSecurityLabelsPolicy(level string) []byte {
	label := func(obj, name, dflt string) string {
		return obj + `.metadata.?labels[?'` + name + `'].orValue(` + dflt + `)`
	}
	rank := func(l string) string { return `(` + l + ` == 'privileged' ? 0 : ` + l + ` == 'baseline' ? 1 : 2)` }
	allowed := func(verb string) string {
		return `authorizer.group('` + podSecurityLevelsGroup + `').resource('` + podSecurityLevelsResource + `').name(variables.level).check('` + verb + `').allowed()`
	}
	return staticPolicy(podSecurityLabelsPolicyName, map[string]any{
		"failurePolicy": "Fail",
		"matchConstraints": map[string]any{"resourceRules": []any{map[string]any{
			"apiGroups": []string{""}, "apiVersions": []string{"v1"}, "operations": []string{"CREATE", "UPDATE"},
			"resources": []string{"namespaces", "namespaces/status", "namespaces/finalize"},
		}}},
		"variables": []any{
			map[string]string{"name": "default", "expression": strconv.Quote(level)},
			map[string]string{"name": "level", "expression": label("object", enforceLabel, "variables.default")},
			map[string]string{"name": "had", "expression": `oldObject == null ? variables.default : ` + label("oldObject", enforceLabel, "variables.default")},
			map[string]string{"name": "version", "expression": label("object", enforceVersionLabel, "'latest'")},
			map[string]string{"name": "hadVersion", "expression": `oldObject == null ? 'latest' : ` + label("oldObject", enforceVersionLabel, "'latest'")},
			map[string]string{"name": "loosens", "expression": rank("variables.level") + ` < ` + rank("variables.default") +
				` && ` + rank("variables.level") + ` < ` + rank("variables.had")},
			map[string]string{"name": "pins", "expression": `variables.version != variables.hadVersion && variables.version != 'latest'`},
		},
		"validations": []any{
			map[string]any{
				"expression": `!variables.loosens || ` + allowed("use"),
				"messageExpression": `'Pod Security level ' + variables.level + ' (label ` + enforceLabel + `) is looser than the cluster default ' + variables.default + ` +
					`' and only who may use it (verb use on ` + podSecurityLevelsResource + `.` + podSecurityLevelsGroup + `/' + variables.level + ', the cluster owner) ` +
					`may give it to a namespace (` + podSecurityLabelsPolicyName + `)'`,
				"reason": "Forbidden",
			},
			map[string]any{
				"expression": `!variables.pins || ` + allowed("pin"),
				"messageExpression": `'Pod Security version ' + variables.version + ' (label ` + enforceVersionLabel + `) may be set only by who may pin ' + variables.level + ` +
					`' (verb pin on ` + podSecurityLevelsResource + `.` + podSecurityLevelsGroup + `/' + variables.level + ', the cluster owner): an older version checks less (` +
					podSecurityLabelsPolicyName + `)'`,
				"reason": "Forbidden",
			},
		},
	})
}
