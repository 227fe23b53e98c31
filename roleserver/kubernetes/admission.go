package kubernetes

import (
	"fmt"
	"slices"
	"strings"

	"plinth.dev/plinth/api/clusterpb"
	"plinth.dev/plinth/platform/layout"
	"plinth.dev/plinth/roleserver/kubernetes/pki"
)

// What a workload may do to its node, enforced by the API server's
// admission, from its first request on:
//
//	--admission-control-config-file=admission.json
//	  PodSecurity                baseline enforced, restricted warned and
//	                             audited, in every namespace that does not
//	                             say otherwise (kube-system: exempt)
//	  ValidatingAdmissionPolicy  staticManifestsDir=admission/
//	    host-paths.json          plinth-host-paths.static.k8s.io: no pod
//	                             and no PersistentVolume (hostPath, local)
//	                             in any namespace, whatever its Pod
//	                             Security level, uses a path that is,
//	                             holds or lies under node state or
//	                             secrets (layout.ProtectedHostPaths),
//	                             but what the owner allows below
//	                             layout.HostVolumesDir, and local
//	                             volumes the node provisioners make
//	    local-volumes.json       plinth-local-volumes.static.k8s.io: a
//	                             node's local volume provisioner
//	                             (pki.LocalVolumesPrefix+node) creates,
//	                             changes and deletes only local
//	                             PersistentVolumes of its own node, each
//	                             at layout.LocalVolumesDir/<its name>
//	    external-ips.json        plinth-external-ips.static.k8s.io: no
//	                             Service names a new external IP outside
//	                             the owner's allowed ranges (none by
//	                             default)
//	    pod-security-labels.json plinth-pod-security-labels.static.k8s.io:
//	                             only who may "use" a level
//	                             (podSecurityLevelsResource) makes a
//	                             namespace's enforced level looser than
//	                             the cluster default or pins its version
//
// The host path policy is a static manifest (Kubernetes' manifest-based
// admission configuration, beta and on in this version): the API server
// loads it before it serves, refuses requests until it has, and nobody
// can delete or weaken it through the API, not even system:masters. Pod
// Security's `privileged` level is node root (a privileged container
// sees the node's devices, the decrypted data volume among them): only
// namespaces the owner labels so get it.

// AdmissionPolicy is the cluster policy's say in admission
// (clusterpb.KubernetesPolicy, checked; the zero value is the default).
type AdmissionPolicy struct {
	// PodSecurity is the Pod Security level enforced in namespaces
	// without a pod-security.kubernetes.io/enforce label: baseline (the
	// default, ""), restricted or privileged.
	PodSecurity string
	// AllowedHostPaths are host paths in layout.HostVolumesDir the owner
	// allows pods and PersistentVolumes to use (absolute; a path below
	// one is allowed too).
	AllowedHostPaths []string
	// AllowedExternalIPs are the ranges (CIDR) Services may name in
	// spec.externalIPs; none by default.
	AllowedExternalIPs []string
}

// admissionPolicy is what cfg says of admission. The curator stores
// only a policy that passes KubernetesPolicy.Check; what does not (a
// policy stored before a stricter check) is ignored here part by part
// rather than put into the API server's configuration: an unknown level
// is Plinth's default (baseline), a refused host path is not allowed,
// and the rest of the policy holds (an owner's restricted level is not
// lost to an allowed path that is no longer).
func admissionPolicy(cfg *clusterpb.ClusterConfiguration) AdmissionPolicy {
	k := cfg.GetKubernetes()
	var p AdmissionPolicy
	if (&clusterpb.KubernetesPolicy{PodSecurityLevel: k.GetPodSecurityLevel()}).Check() == nil {
		p.PodSecurity = k.GetPodSecurityLevel()
	}
	for _, a := range k.GetAllowedHostPaths() {
		if (&clusterpb.KubernetesPolicy{AllowedHostPaths: []string{a}}).Check() == nil {
			p.AllowedHostPaths = append(p.AllowedHostPaths, a)
		}
	}
	for _, c := range k.GetAllowedExternalIps() {
		if clusterpb.CheckExternalIPRange(c) == nil {
			p.AllowedExternalIPs = append(p.AllowedExternalIPs, c)
		}
	}
	return p
}

func (p AdmissionPolicy) equal(q AdmissionPolicy) bool {
	return p.PodSecurity == q.PodSecurity && slices.Equal(p.AllowedHostPaths, q.AllowedHostPaths) &&
		slices.Equal(p.AllowedExternalIPs, q.AllowedExternalIPs)
}

// level is the Pod Security level enforced where a namespace names none.
func (p AdmissionPolicy) level() string {
	if p.PodSecurity == "" {
		return "baseline"
	}
	return p.PodSecurity
}

// Files of the admission configuration, in the controller directory.
const (
	fileAdmission       = "admission.json"
	dirAdmissionStatic  = "admission"
	fileHostPathsPolicy = dirAdmissionStatic + "/host-paths.json"
	hostPathsPolicyName = "plinth-host-paths.static.k8s.io"

	fileLocalVolumesPolicy = dirAdmissionStatic + "/local-volumes.json"
	localVolumesPolicyName = "plinth-local-volumes.static.k8s.io"

	fileExternalIPsPolicy = dirAdmissionStatic + "/external-ips.json"
	externalIPsPolicyName = "plinth-external-ips.static.k8s.io"

	filePodSecurityLabelsPolicy = dirAdmissionStatic + "/pod-security-labels.json"
	podSecurityLabelsPolicyName = "plinth-pod-security-labels.static.k8s.io"
)

// admissionFiles are the admission configuration (admission.json) and
// the host path policy it loads, for the API server run from dir.
func admissionFiles(dir string, p AdmissionPolicy) files {
	level := p.level()
	config := map[string]any{
		"apiVersion": "apiserver.config.k8s.io/v1",
		"kind":       "AdmissionConfiguration",
		"plugins": []any{
			map[string]any{"name": "PodSecurity", "configuration": map[string]any{
				"apiVersion": "pod-security.admission.config.k8s.io/v1",
				"kind":       "PodSecurityConfiguration",
				"defaults": map[string]string{
					"enforce": level, "enforce-version": "latest",
					"audit": "restricted", "audit-version": "latest",
					"warn": "restricted", "warn-version": "latest",
				},
				"exemptions": map[string][]string{"usernames": {}, "runtimeClasses": {}, "namespaces": {"kube-system"}},
			}},
			map[string]any{"name": "ValidatingAdmissionPolicy", "configuration": map[string]any{
				"apiVersion":         "apiserver.config.k8s.io/v1",
				"kind":               "ValidatingAdmissionPolicyConfiguration",
				"staticManifestsDir": dir + "/" + dirAdmissionStatic,
			}},
		},
	}
	return files{
		fileAdmission:               mustJSON(config),
		fileHostPathsPolicy:         hostPathsPolicy(layout.ProtectedHostPaths(), layout.HostVolumesDir, p.AllowedHostPaths),
		fileLocalVolumesPolicy:      localVolumesPolicy(),
		fileExternalIPsPolicy:       externalIPsPolicy(p.AllowedExternalIPs),
		filePodSecurityLabelsPolicy: podSecurityLabelsPolicy(level),
	}
}

// hostPathsPolicy is the ValidatingAdmissionPolicy (and its binding)
// refusing pods and PersistentVolumes whose host paths are, contain or
// lie under a protected path, unless they lie under an allowed one that
// is in the volumes directory: the allow list opens nothing else even if
// it names more (defence in depth behind KubernetesPolicy.Check, which
// refuses such a list). Paths are compared normalised (empty and "."
// elements dropped, so //data, /data/ and /./data are /data; a relative
// path is taken from /, as the kubelet would resolve it; the API refuses
// ".." elements) with a trailing slash, so /database is not under /data.
//
// One exception: a local PersistentVolume in layout.LocalVolumesDir, if
// a node's provisioner creates it (localVolumesPolicy holds it to its
// own node and directory), or if its path is what it was (the PV
// controller's and the owner's updates of a volume; the API keeps a
// volume's source as it was created anyway).
func hostPathsPolicy(protected []string, volumes string, allowed []string) []byte {
	dir := func(p string) string { return "'" + strings.TrimSuffix(p, "/") + "/'" }
	dirs := func(ps []string) string {
		var q []string
		for _, p := range ps {
			q = append(q, dir(p))
		}
		return "[" + strings.Join(q, ", ") + "]"
	}
	parts := `p.split('/').filter(s, s != '' && s != '.')`
	norm := `(` + parts + `.size() == 0 ? '/' : '/' + ` + parts + `.join('/') + '/')`
	localVolume := `(object.kind == 'PersistentVolume' && has(object.spec.local) && p == object.spec.local.path && ` +
		norm + `.startsWith('` + layout.LocalVolumesDir + `/') && (request.userInfo.username.startsWith('` + pki.LocalVolumesPrefix + `') || ` +
		`(oldObject != null && has(oldObject.spec.local) && oldObject.spec.local.path == p)))`
	refused := `variables.protected.exists(q, ` + norm + `.startsWith(q) || q.startsWith(` + norm + `)) && ` +
		`!(` + norm + `.startsWith(variables.volumes) && variables.allowed.exists(a, ` + norm + `.startsWith(a))) && !` + localVolume
	return staticPolicy(hostPathsPolicyName, map[string]any{
		"failurePolicy": "Fail",
		"matchConstraints": map[string]any{"resourceRules": []any{map[string]any{
			"apiGroups": []string{""}, "apiVersions": []string{"v1"}, "operations": []string{"CREATE", "UPDATE"},
			"resources": []string{"pods", "pods/ephemeralcontainers", "persistentvolumes"},
		}}},
		"variables": []any{
			map[string]string{"name": "protected", "expression": dirs(protected)},
			map[string]string{"name": "volumes", "expression": dir(volumes)},
			map[string]string{"name": "allowed", "expression": dirs(allowed)},
			map[string]string{"name": "paths", "expression": `object.kind == 'Pod' ? ` +
				`object.spec.?volumes.orValue([]).filter(v, has(v.hostPath)).map(v, v.hostPath.path) : ` +
				`(has(object.spec.hostPath) ? [object.spec.hostPath.path] : []) + (has(object.spec.local) ? [object.spec.local.path] : [])`},
			map[string]string{"name": "refused", "expression": `variables.paths.filter(p, ` + refused + `)`},
		},
		"validations": []any{map[string]any{
			"expression": "size(variables.refused) == 0",
			"message":    "a host path is refused by Plinth's host path policy: it is, holds or lies under node state or secrets",
			"messageExpression": `'host path ' + variables.refused.join(', ') + ' refused by Plinth\'s host path policy (` + hostPathsPolicyName +
				`): it is, holds or lies under node state or secrets (` + strings.Join(protected, " ") + `); the cluster owner can allow a path below ` +
				strings.TrimSuffix(volumes, "/") + ` in the cluster policy'`,
			"reason": "Forbidden",
		}},
	})
}

// localVolumesPolicy is the ValidatingAdmissionPolicy (and its binding)
// holding each node's local volume provisioner (user
// pki.LocalVolumesPrefix+<node>; RBAC lets its group create and delete
// PersistentVolumes) to its own volumes: it may create, change or
// delete a PersistentVolume only if the volume is local, at
// layout.LocalVolumesDir/<its name>, marked as provisioned by
// layout.LocalVolumesProvisioner and bound by node affinity to its node
// alone. A node's credentials, stolen, reach no other node's volumes and
// no path outside that directory.
func localVolumesPolicy() []byte {
	pv := `(request.operation == 'DELETE' ? oldObject : object)`
	return staticPolicy(localVolumesPolicyName, map[string]any{
		"failurePolicy": "Fail",
		"matchConstraints": map[string]any{"resourceRules": []any{map[string]any{
			"apiGroups": []string{""}, "apiVersions": []string{"v1"}, "operations": []string{"CREATE", "UPDATE", "DELETE"},
			"resources": []string{"persistentvolumes"},
		}}},
		"matchConditions": []any{map[string]string{"name": "provisioner",
			"expression": `request.userInfo.username.startsWith('` + pki.LocalVolumesPrefix + `')`}},
		"variables": []any{
			map[string]string{"name": "pv", "expression": pv},
			map[string]string{"name": "node", "expression": `request.userInfo.username.substring(` + fmt.Sprint(len(pki.LocalVolumesPrefix)) + `)`},
			map[string]string{"name": "terms", "expression": `variables.pv.spec.?nodeAffinity.?required.?nodeSelectorTerms.orValue([])`},
		},
		"validations": []any{
			map[string]any{
				"expression": `has(variables.pv.spec.local) && !has(variables.pv.spec.hostPath) && ` +
					`variables.pv.spec.local.path == '` + layout.LocalVolumesDir + `/' + variables.pv.metadata.name && ` +
					`variables.pv.metadata.?annotations[?'pv.kubernetes.io/provisioned-by'].orValue('') == '` + layout.LocalVolumesProvisioner + `'`,
				"messageExpression": `'a node\'s local volume provisioner may only make local volumes at ` + layout.LocalVolumesDir +
					`/<the volume\'s name>, provisioned by ` + layout.LocalVolumesProvisioner + ` (` + localVolumesPolicyName + `)'`,
				"reason": "Forbidden",
			},
			map[string]any{
				"expression": `size(variables.terms) == 1 && size(variables.terms[0].?matchExpressions.orValue([])) == 1 && ` +
					`!has(variables.terms[0].matchFields) && variables.terms[0].matchExpressions[0].key == 'kubernetes.io/hostname' && ` +
					`variables.terms[0].matchExpressions[0].operator == 'In' && variables.terms[0].matchExpressions[0].?values.orValue([]) == [variables.node]`,
				"messageExpression": `'the local volume provisioner of node ' + variables.node + ' may only make and delete volumes bound to node ' + variables.node + ' (` + localVolumesPolicyName + `)'`,
				"reason":            "Forbidden",
			},
		},
	})
}

// staticPolicy is a static manifest: the ValidatingAdmissionPolicy name
// of spec and its binding, which denies what it refuses.
func staticPolicy(name string, spec map[string]any) []byte {
	policy := map[string]any{
		"apiVersion": "admissionregistration.k8s.io/v1",
		"kind":       "ValidatingAdmissionPolicy",
		"metadata":   map[string]any{"name": name},
		"spec":       spec,
	}
	binding := map[string]any{
		"apiVersion": "admissionregistration.k8s.io/v1",
		"kind":       "ValidatingAdmissionPolicyBinding",
		"metadata":   map[string]any{"name": name},
		"spec":       map[string]any{"policyName": name, "validationActions": []string{"Deny"}},
	}
	return mustJSON(map[string]any{"apiVersion": "v1", "kind": "List", "items": []any{policy, binding}})
}
