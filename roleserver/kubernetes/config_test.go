package kubernetes

import (
	"encoding/json"
	"net"
	"reflect"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/google/cel-go/common/types/ref"
	"github.com/pelletier/go-toml/v2"
	audit "k8s.io/apiserver/pkg/apis/audit"
	auditpolicy "k8s.io/apiserver/pkg/audit/policy"
	"k8s.io/apiserver/pkg/authentication/user"
	"k8s.io/apiserver/pkg/authorization/authorizer"

	"plinth.dev/plinth/api/clusterpb"
	"plinth.dev/plinth/platform/layout"
	"plinth.dev/plinth/roleserver/kubernetes/pki"
	"plinth.dev/plinth/roleserver/localstorage"
)

func testRoot(t *testing.T) *localstorage.Root {
	t.Helper()
	root := &localstorage.Root{}
	if err := localstorage.Place(root, "/"); err != nil {
		t.Fatal(err)
	}
	return root
}

// TestContainerdConfig: the generated configuration is TOML containerd
// 2.x reads (version 3), with state where Plinth keeps it.
func TestContainerdConfig(t *testing.T) {
	root := testRoot(t)
	var c struct {
		Version int    `toml:"version"`
		Root    string `toml:"root"`
		State   string `toml:"state"`
		GRPC    struct {
			Address string `toml:"address"`
		} `toml:"grpc"`
		Plugins map[string]map[string]any `toml:"plugins"`
	}
	if err := toml.Unmarshal(containerdConfig(root), &c); err != nil {
		t.Fatalf("not TOML: %v\n%s", err, containerdConfig(root))
	}
	if c.Version != 3 || c.Root != "/data/containerd" || c.State != "/ephemeral/containerd" || c.GRPC.Address != "/ephemeral/containerd/containerd.sock" {
		t.Errorf("containerd config: %+v", c)
	}
	images := c.Plugins["io.containerd.cri.v1.images"]
	if pinned, _ := images["pinned_images"].(map[string]any); pinned["sandbox"] != layout.PauseImage {
		t.Errorf("sandbox image not pinned: %v", images)
	}
	rt := c.Plugins["io.containerd.cri.v1.runtime"]
	cni, _ := rt["cni"].(map[string]any)
	if cni["conf_dir"] != "/ephemeral/kubernetes/cni" || cni["use_internal_loopback"] != true {
		t.Errorf("CNI config: %v", cni)
	}
	// containerd parses it with time.ParseDuration (a TOML integer is
	// refused); its default is a second.
	if p, ok := rt["stats_collect_period"].(string); !ok {
		t.Errorf("stats_collect_period: %v, want a duration string", rt["stats_collect_period"])
	} else if d, err := time.ParseDuration(p); err != nil || d < 10*time.Second {
		t.Errorf("stats_collect_period %q: %v, want at least 10s", p, err)
	}
	// The handler keeps runc's name (what kept sandboxes record); the
	// binary is crun.
	if d := rt["containerd"].(map[string]any)["default_runtime_name"]; d != "runc" {
		t.Errorf("default runtime %v, want runc", d)
	}
	runc := rt["containerd"].(map[string]any)["runtimes"].(map[string]any)["runc"].(map[string]any)
	if opts := runc["options"].(map[string]any); opts["BinaryName"] != layout.OCIRuntimeBinary || opts["SystemdCgroup"] != false || runc["runtime_type"] != "io.containerd.runc.v2" {
		t.Errorf("runc handler options: %v", runc)
	}
}

// TestKubeletConfig: nothing the kubelet writes lands on the read-only
// system image, only the API server may use its API, DNS is the node's.
func TestKubeletConfig(t *testing.T) {
	root := testRoot(t)
	var c map[string]any
	b := kubeletConfig(kubeletParams{root: root, clientCA: "/ca.pem", certFile: "/c.pem", keyFile: "/k.pem", resolvConf: "/run/resolv.conf"})
	if err := json.Unmarshal(b, &c); err != nil {
		t.Fatal(err)
	}
	for k, want := range map[string]any{
		"kind": "KubeletConfiguration", "apiVersion": "kubelet.config.k8s.io/v1beta1",
		"cgroupDriver": "cgroupfs", "cgroupRoot": "/", "readOnlyPort": 0.0,
		"podLogsDir": "/data/kubernetes/pod-logs", "volumePluginDir": "/ephemeral/kubernetes/volume-plugins",
		"containerRuntimeEndpoint": "unix:///ephemeral/containerd/containerd.sock",
		"clusterDomain":            "cluster.local", "tlsCertFile": "/c.pem", "staticPodPath": "",
		// Every container without a profile of its own runs under the
		// runtime's default seccomp profile.
		"seccompDefault": true,
	} {
		if c[k] != want {
			t.Errorf("%s = %v, want %v", k, c[k], want)
		}
	}
	if dns, _ := c["clusterDNS"].([]any); len(dns) != 1 || dns[0] != layout.ClusterDNSIP {
		t.Errorf("clusterDNS %v", c["clusterDNS"])
	}
	auth := c["authentication"].(map[string]any)
	if auth["anonymous"].(map[string]any)["enabled"] != false || auth["x509"].(map[string]any)["clientCAFile"] != "/ca.pem" {
		t.Errorf("authentication %v", auth)
	}
}

// TestKubeletReserved: a controller's kubelet keeps half its CPUs, at
// most two, from pods for the control plane; a worker's keeps none.
func TestKubeletReserved(t *testing.T) {
	root := testRoot(t)
	for _, c := range []struct {
		cpus         int
		controlPlane bool
		want         string
	}{{2, true, "1000m"}, {1, true, "500m"}, {16, true, "2000m"}, {2, false, ""}} {
		var cfg struct {
			KubeReserved map[string]string `json:"kubeReserved"`
		}
		if err := json.Unmarshal(kubeletConfig(kubeletParams{root: root, cpus: c.cpus, controlPlane: c.controlPlane}), &cfg); err != nil {
			t.Fatal(err)
		}
		if got := cfg.KubeReserved["cpu"]; got != c.want {
			t.Errorf("%d CPUs, control plane %v: kubeReserved cpu %q, want %q", c.cpus, c.controlPlane, got, c.want)
		}
	}
}

// TestControlPlaneArgs: the API server uses the confined etcd endpoint
// and never compacts it (the consensus service does), checks kubelets'
// serving certificates against their own CA, starts with its admission,
// audit and encryption policies; the controller manager's pod CIDR
// allocator is off.
func TestControlPlaneArgs(t *testing.T) {
	f := map[string]string{}
	for _, n := range []string{fileCA, fileAPIServerCert, fileAPIServerKey, fileServiceAccountKey, fileControllerManager, fileScheduler,
		fileKubeletServingCA, fileAdmission, fileAuditPolicy, fileEncryption, fileAuthorization} {
		f[n] = "/x/" + n
	}
	api := apiserverArgs(f, net.ParseIP("10.42.0.10"), "/ephemeral/kubernetes/etcd.sock")
	for _, want := range []string{"--etcd-servers=unix:///ephemeral/kubernetes/etcd.sock", "--advertise-address=10.42.0.10",
		"--service-cluster-ip-range=" + layout.ServiceCIDR, "--authorization-config=/x/authorization.json", "--client-ca-file=/x/ca.pem",
		"--etcd-compaction-interval=8760h0m0s", "--kubelet-certificate-authority=/x/kubelet-serving-ca.pem",
		"--enable-admission-plugins=NodeRestriction", "--admission-control-config-file=/x/admission.json",
		"--audit-policy-file=/x/audit-policy.json", "--audit-log-path=-", "--audit-log-format=json",
		"--audit-log-truncate-enabled=true", "--audit-log-truncate-max-event-size=16384",
		"--encryption-provider-config=/x/encryption.json"} {
		if !slices.Contains(api, want) {
			t.Errorf("apiserver args lack %s: %v", want, api)
		}
	}
	if api[0] != "apiserver" {
		t.Errorf("component %q", api[0])
	}
	cm := controllerManagerArgs(f, "/ephemeral/kubernetes/volume-plugins")
	// Pod CIDRs are the core's node IPAM's (nodeipam.go), not its.
	for _, want := range []string{"--allocate-node-cidrs=false", "--cluster-cidr=" + layout.ClusterCIDR} {
		if !slices.Contains(cm, want) {
			t.Errorf("controller-manager args lack %s: %v", want, cm)
		}
	}
	if !strings.Contains(strings.Join(cm, " "), "-csrsigning") {
		t.Error("the CSR signer runs")
	}
}

// TestLeaderElectionTimes: the controller manager's and scheduler's
// leader election times are what they check at start (lease > renew
// deadline > 1.2 × retry period) and give each renewal request (half the
// renew deadline) at least 20 s.
func TestLeaderElectionTimes(t *testing.T) {
	lease, renew, retry := leaderElection.lease, leaderElection.renew, leaderElection.retry
	if lease <= renew || float64(renew) <= 1.2*float64(retry) {
		t.Errorf("lease %v, renew deadline %v, retry period %v: the components refuse them", lease, renew, retry)
	}
	if renew/2 < 20*time.Second {
		t.Errorf("a renewal request times out after %v, under the 20 s a busy API server took", renew/2)
	}
	for _, args := range [][]string{controllerManagerArgs(map[string]string{}, "/x"), schedulerArgs(map[string]string{})} {
		if !slices.Contains(args, "--leader-elect-renew-deadline="+renew.String()) {
			t.Errorf("%s: no renew deadline of %s in %v", args[0], renew, args)
		}
	}
}

// TestKubeconfigAndProxy: kubeconfigs are valid JSON for one user, the
// proxy config points at its kubeconfig, the Corefile binds the DNS IP.
func TestKubeconfigAndProxy(t *testing.T) {
	var kc struct {
		Clusters []struct {
			Cluster map[string]any `json:"cluster"`
		} `json:"clusters"`
		CurrentContext string `json:"current-context"`
	}
	if err := json.Unmarshal(kubeconfig("https://127.0.0.1:6444", "", []byte("CA"), []byte("C"), []byte("K")), &kc); err != nil {
		t.Fatal(err)
	}
	if len(kc.Clusters) != 1 || kc.Clusters[0].Cluster["server"] != "https://127.0.0.1:6444" || kc.CurrentContext != "plinth" {
		t.Errorf("kubeconfig %+v", kc)
	}
	var pc map[string]any
	if err := json.Unmarshal(proxyConfig("/w/proxy.kubeconfig", "plinth-x"), &pc); err != nil {
		t.Fatal(err)
	}
	if pc["mode"] != "nftables" || pc["hostnameOverride"] != "plinth-x" || pc["clusterCIDR"] != layout.ClusterCIDR {
		t.Errorf("proxy config %v", pc)
	}
	cf := string(corefile("/w/proxy.kubeconfig", "/run/resolv.conf"))
	for _, want := range []string{"bind " + layout.ClusterDNSIP, "kubernetes cluster.local", "kubeconfig /w/proxy.kubeconfig", "forward . /run/resolv.conf"} {
		if !strings.Contains(cf, want) {
			t.Errorf("Corefile lacks %q:\n%s", want, cf)
		}
	}
}

// TestAdmissionConfiguration: the cluster policy's Pod Security level is
// the one enforced where a namespace says nothing (baseline by
// default), restricted is warned of and audited, kube-system is exempt,
// and the host path policy is loaded from the static manifests beside
// it. A policy stored before a stricter check keeps its level while its
// refused host paths are dropped.
func TestAdmissionConfiguration(t *testing.T) {
	type config struct {
		Plugins []struct {
			Name          string
			Configuration struct {
				Defaults           map[string]string
				Exemptions         map[string][]string
				StaticManifestsDir string
			}
		}
	}
	for _, tc := range []struct {
		name    string
		policy  *clusterpb.KubernetesPolicy
		level   string
		allowed []string
	}{
		{"default", nil, "baseline", nil},
		{"restricted", &clusterpb.KubernetesPolicy{PodSecurityLevel: "restricted"}, "restricted", nil},
		{"privileged", &clusterpb.KubernetesPolicy{PodSecurityLevel: "privileged"}, "privileged", nil},
		{"unknown level", &clusterpb.KubernetesPolicy{PodSecurityLevel: "root"}, "baseline", nil},
		{"refused host path", &clusterpb.KubernetesPolicy{PodSecurityLevel: "restricted", AllowedHostPaths: []string{"/ephemeral", "/data/volumes/db"}},
			"restricted", []string{"/data/volumes/db"}},
	} {
		p := admissionPolicy(&clusterpb.ClusterConfiguration{Kubernetes: tc.policy})
		if !slices.Equal(p.AllowedHostPaths, tc.allowed) {
			t.Errorf("%s: allowed host paths %v, want %v", tc.name, p.AllowedHostPaths, tc.allowed)
		}
		f := admissionFiles("/c", p)
		var c config
		if err := json.Unmarshal(f[fileAdmission], &c); err != nil || len(c.Plugins) != 2 {
			t.Fatalf("%s: admission configuration %v: %s", tc.name, err, f[fileAdmission])
		}
		ps, vap := c.Plugins[0], c.Plugins[1]
		if d := ps.Configuration.Defaults; ps.Name != "PodSecurity" || d["enforce"] != tc.level || d["warn"] != "restricted" || d["audit"] != "restricted" {
			t.Errorf("%s: Pod Security %s %v, want %s enforced, restricted warned and audited", tc.name, ps.Name, d, tc.level)
		}
		if ex := ps.Configuration.Exemptions["namespaces"]; !slices.Equal(ex, []string{"kube-system"}) {
			t.Errorf("%s: namespaces exempt from Pod Security: %v", tc.name, ex)
		}
		if vap.Name != "ValidatingAdmissionPolicy" || vap.Configuration.StaticManifestsDir != "/c/"+dirAdmissionStatic || f[fileHostPathsPolicy] == nil {
			t.Errorf("%s: the host path policy is not loaded from its static manifest: %+v", tc.name, vap)
		}
	}
}

// TestProtectedHostPaths: the protected host paths (platform/layout) are
// the local storage tree's roots as the node places them, and hold the
// node's sockets, credentials, mounts and links; not /tmp (whose links
// are never followed) nor /etc/hosts (read-only, trusted by nothing).
func TestProtectedHostPaths(t *testing.T) {
	root := testRoot(t)
	if root.Data.Kubernetes.LocalVolumes.Path() != layout.LocalVolumesDir {
		t.Errorf("the local volumes' directory %s is not layout's %s", root.Data.Kubernetes.LocalVolumes.Path(), layout.LocalVolumesDir)
	}
	if root.Data.Path() != layout.DataMount || root.Ephemeral.Path() != layout.EphemeralMount {
		t.Errorf("the local storage tree's roots %s, %s are not layout's %s, %s", root.Data.Path(), root.Ephemeral.Path(), layout.DataMount, layout.EphemeralMount)
	}
	ps := layout.ProtectedHostPaths()
	for _, want := range []string{"/data", "/ephemeral", "/run", "/var/run", "/var/lib/kubelet", "/var/lib/cni", "/var/log", "/run/plinth/esp",
		"/proc", "/sys", "/dev", "/etc/resolv.conf", "/etc/machine-id", "/etc/hostname"} {
		if !slices.Contains(ps, want) {
			t.Errorf("%s is not protected: %v", want, ps)
		}
	}
	// /tmp is the pods' (its links are never followed: layout.TmpMount);
	// /etc/hosts is the image's (layout.HostsFile).
	for _, p := range []string{layout.TmpMount, layout.HostsFile} {
		if slices.Contains(ps, p) {
			t.Errorf("%s is protected: %v", p, ps)
		}
	}
}

// TestHostPathsPolicy evaluates the host path policy's CEL as the API
// server does (its variables in order, then the validation; Kubernetes's
// string extensions and optional fields): protected paths are refused
// however they are spelled, what is outside them passes, and the allow
// list opens only paths in the host volumes directory, even a list that
// names /ephemeral, /data or /tmp (which KubernetesPolicy.Check refuses
// to store): defence in depth.
func TestHostPathsPolicy(t *testing.T) {
	policy := hostPathsPolicy(layout.ProtectedHostPaths(), layout.HostVolumesDir, []string{"/data/volumes/db", "/ephemeral", "/tmp", "/proc"})
	for _, p := range []string{"/ephemeral", "/ephemeral/kubernetes/controller/apiserver", "/data", "//data", "/data/", "/./data", "/data/etcd",
		"/data/volumes", "/data/volumes/x", "/data/volumesx", "/", "/var", "/var/run", "/var/lib/kubelet/pods", "/etc", "/etc/",
		"/etc/hostname", "/etc/resolv.conf", "/etc/machine-id", "/run/hosts",
		"/run/plinth/esp", "/proc/1/root", "/dev/mapper", "/sys/fs/cgroup", "/var/log", "data/etcd"} {
		for _, object := range []map[string]any{
			{"kind": "Pod", "spec": map[string]any{"volumes": []any{map[string]any{"name": "h", "hostPath": map[string]any{"path": p}}}}},
			{"kind": "PersistentVolume", "spec": map[string]any{"local": map[string]any{"path": p}}},
			{"kind": "PersistentVolume", "spec": map[string]any{"hostPath": map[string]any{"path": p}}},
		} {
			if ok, refused := evalHostPathsPolicy(t, policy, object); ok || !slices.Equal(refused, []string{p}) {
				t.Errorf("%s with host path %q: admitted %v, refused %v", object["kind"], p, ok, refused)
			}
		}
	}
	for _, p := range []string{"/data/volumes/db", "/data/volumes/db/x", "//data/volumes/./db/", "/usr/share", "/database", "/lib/modules", "/temp", "/tmp", "/tmp/job-e2e/x",
		"/etc/hosts", "//etc/./hosts"} {
		pod := map[string]any{"kind": "Pod", "spec": map[string]any{"volumes": []any{map[string]any{"name": "h", "hostPath": map[string]any{"path": p}}}}}
		if ok, refused := evalHostPathsPolicy(t, policy, pod); !ok {
			t.Errorf("a pod with host path %q: refused %v", p, refused)
		}
	}
	// Even /data allowed opens only the host volumes directory.
	podOf := func(p string) map[string]any {
		return map[string]any{"kind": "Pod", "spec": map[string]any{"volumes": []any{map[string]any{"name": "h", "hostPath": map[string]any{"path": p}}}}}
	}
	data := hostPathsPolicy(layout.ProtectedHostPaths(), layout.HostVolumesDir, []string{"/data"})
	for p, want := range map[string]bool{"/data/volumes/x": true, "/data/etcd": false, "/data": false, "/data/node/credentials": false} {
		if ok, refused := evalHostPathsPolicy(t, data, podOf(p)); ok != want {
			t.Errorf("/data allowed, a pod with host path %s: admitted %v (refused %v), want %v", p, ok, refused, want)
		}
	}
	// A pod without host paths passes; one protected path of two refuses.
	if ok, _ := evalHostPathsPolicy(t, policy, map[string]any{"kind": "Pod", "spec": map[string]any{"volumes": []any{map[string]any{"name": "e", "emptyDir": map[string]any{}}}}}); !ok {
		t.Error("a pod without host paths refused")
	}
	two := map[string]any{"kind": "Pod", "spec": map[string]any{"volumes": []any{
		map[string]any{"name": "a", "hostPath": map[string]any{"path": "/usr/share"}}, map[string]any{"name": "b", "hostPath": map[string]any{"path": "/ephemeral"}}}}}
	if ok, refused := evalHostPathsPolicy(t, policy, two); ok || !slices.Equal(refused, []string{"/ephemeral"}) {
		t.Errorf("a pod with one protected host path of two: admitted %v, refused %v", ok, refused)
	}

	// The local volumes directory: a local PersistentVolume there only
	// from a node's provisioner (localVolumesPolicy holds it to its
	// own), or unchanged by an update; never a pod's or a hostPath's.
	lv := layout.LocalVolumesDir + "/pvc-1"
	local := func(p string) map[string]any {
		return map[string]any{"kind": "PersistentVolume", "spec": map[string]any{"local": map[string]any{"path": p}}}
	}
	hostPathPV := map[string]any{"kind": "PersistentVolume", "spec": map[string]any{"hostPath": map[string]any{"path": lv}}}
	provisioner := pki.LocalVolumesPrefix + "n1"
	for _, c := range []struct {
		what        string
		object, old map[string]any
		user        string
		want        bool
	}{
		{"a provisioner's local volume", local(lv), nil, provisioner, true},
		{"an owner's local volume", local(lv), nil, "plinth-owner:1", false},
		{"an update keeping the path", local(lv), local(lv), "system:serviceaccount:kube-system:persistent-volume-binder", true},
		{"an update changing the path", local(lv), local(lv + "x"), "plinth-owner:1", false},
		{"a provisioner's local volume of the directory itself", local(layout.LocalVolumesDir), nil, provisioner, true},
		{"a provisioner's local volume elsewhere in the node's state", local("/data/etcd"), nil, provisioner, false},
		{"a provisioner's hostPath volume", hostPathPV, nil, provisioner, false},
		{"a provisioner's pod", podOf(lv), nil, provisioner, false},
	} {
		if ok, refused := evalHostPathsPolicyAs(t, policy, c.object, c.old, c.user); ok != c.want {
			t.Errorf("%s: admitted %v (refused %v), want %v", c.what, ok, refused, c.want)
		}
	}
}

// evalHostPathsPolicy evaluates the generated policy on object, created
// by an owner: whether its validation passes, and the host paths it
// refused.
func evalHostPathsPolicy(t *testing.T, policy []byte, object map[string]any) (bool, []string) {
	t.Helper()
	return evalHostPathsPolicyAs(t, policy, object, nil, "plinth-owner:1")
}

// evalHostPathsPolicyAs is evalHostPathsPolicy for a request by user,
// an update of old (nil: a creation).
func evalHostPathsPolicyAs(t *testing.T, policy []byte, object, old map[string]any, user string) (bool, []string) {
	t.Helper()
	r := evalPolicy(t, policy, policyRequest{object: object, old: old, user: user})
	refused, err := r.vars["refused"].(ref.Val).ConvertToNative(reflect.TypeFor[[]string]())
	if err != nil {
		t.Fatal(err)
	}
	return r.ok, refused.([]string)
}

// TestAuditPolicy evaluates the generated audit policy as the API
// server does (its own policy evaluator): Secrets and tokens never above
// Metadata whatever the verb; RBAC changes and exec, attach and
// port-forward with their requests and answers, RBAC reads as Metadata;
// health probes not at all.
func TestAuditPolicy(t *testing.T) {
	p, err := auditpolicy.LoadPolicyFromBytes(auditPolicy)
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(p.OmitStages, []audit.Stage{audit.StageRequestReceived}) {
		t.Errorf("stages left out: %v", p.OmitStages)
	}
	ev := auditpolicy.NewPolicyRuleEvaluator(p)
	level := func(verb, group, resource, subresource string) audit.Level {
		return ev.EvaluatePolicyRule(&authorizer.AttributesRecord{User: &user.DefaultInfo{Name: "plinth-owner:1"}, Verb: verb,
			APIGroup: group, APIVersion: "v1", Resource: resource, Subresource: subresource, Namespace: "default", Name: "x", ResourceRequest: true}).Level
	}
	for _, verb := range []string{"get", "list", "watch", "create", "update", "patch", "delete", "deletecollection"} {
		for _, r := range [][3]string{{"", "secrets", ""}, {"", "serviceaccounts", "token"}, {"authentication.k8s.io", "tokenreviews", ""},
			{"rbac.authorization.k8s.io", "clusterroles", ""}, {"", "configmaps", ""}, {"", "pods", ""}} {
			want := audit.LevelMetadata
			if r[0] == "rbac.authorization.k8s.io" && slices.Contains(auditWriteVerbs, verb) {
				want = audit.LevelRequestResponse
			}
			if got := level(verb, r[0], r[1], r[2]); got != want {
				t.Errorf("%s %s/%s/%s: %s, want %s", verb, r[0], r[1], r[2], got, want)
			}
		}
	}
	for _, r := range []string{"roles", "rolebindings", "clusterrolebindings"} {
		if got := level("patch", "rbac.authorization.k8s.io", r, ""); got != audit.LevelRequestResponse {
			t.Errorf("patch %s: %s", r, got)
		}
		if got := level("list", "rbac.authorization.k8s.io", r, ""); got != audit.LevelMetadata {
			t.Errorf("list %s: %s", r, got)
		}
	}
	for _, sub := range []string{"exec", "attach", "portforward"} {
		for _, verb := range []string{"create", "get"} {
			if got := level(verb, "", "pods", sub); got != audit.LevelRequestResponse {
				t.Errorf("%s pods/%s: %s, want RequestResponse", verb, sub, got)
			}
		}
	}
	for path, want := range map[string]audit.Level{"/healthz": audit.LevelNone, "/readyz": audit.LevelNone, "/readyz/etcd": audit.LevelNone,
		"/livez": audit.LevelNone, "/version": audit.LevelMetadata, "/api": audit.LevelMetadata} {
		if got := ev.EvaluatePolicyRule(&authorizer.AttributesRecord{User: &user.DefaultInfo{Name: "system:anonymous"}, Verb: "get", Path: path}).Level; got != want {
			t.Errorf("GET %s: %s, want %s", path, got, want)
		}
	}
}
