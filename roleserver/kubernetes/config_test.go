package kubernetes

import (
	"encoding/json"
	"net"
	"slices"
	"strings"
	"testing"

	"github.com/pelletier/go-toml/v2"

	"plinth.dev/plinth/platform/layout"
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
	runc := rt["containerd"].(map[string]any)["runtimes"].(map[string]any)["runc"].(map[string]any)
	if opts := runc["options"].(map[string]any); opts["BinaryName"] != layout.RuncBinary || opts["SystemdCgroup"] != false {
		t.Errorf("runc options: %v", runc)
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

// TestControlPlaneArgs: the API server uses the confined etcd endpoint,
// the controller manager allocates pod CIDRs.
func TestControlPlaneArgs(t *testing.T) {
	f := map[string]string{}
	for _, n := range []string{fileCA, fileAPIServerCert, fileAPIServerKey, fileServiceAccountKey, fileControllerManager, fileScheduler} {
		f[n] = "/x/" + n
	}
	api := apiserverArgs(f, net.ParseIP("10.42.0.10"), "/ephemeral/kubernetes/etcd.sock")
	for _, want := range []string{"--etcd-servers=unix:///ephemeral/kubernetes/etcd.sock", "--advertise-address=10.42.0.10",
		"--service-cluster-ip-range=" + layout.ServiceCIDR, "--authorization-mode=Node,RBAC", "--client-ca-file=/x/ca.pem"} {
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
