package clusterpb

import (
	"errors"
	"strings"
	"testing"

	"plinth.dev/plinth/platform/layout"
)

// TestCheckAllowedHostPaths: the allow list cannot open node state or
// secrets: an entry that is, contains or lies under a protected host
// path (the etcd socket's directory, /ephemeral, /data, /run, the
// kubelet's directory, the ESP, /tmp, /proc, ...) is refused with a
// *ProtectedHostPathError naming the path, the protected one and how
// they meet; the host volumes directory and what lies below it, and
// paths that meet nothing protected, pass.
func TestCheckAllowedHostPaths(t *testing.T) {
	for _, tc := range []struct {
		path, protected, how string
	}{
		{"/ephemeral", "/ephemeral", "is"},
		{"/ephemeral/kubernetes/controller/apiserver", "/ephemeral", "lies under"},
		{"/ephemeral/consensus", "/ephemeral", "lies under"},
		{"/data", "/data", "is"},
		{"/data/etcd", "/data", "lies under"},
		{"/data/node/credentials", "/data", "lies under"},
		{"/data/volumesx", "/data", "lies under"},
		{"/run", "/run", "is"},
		{"/run/plinth/esp", "/run", "lies under"},
		{"/var/run", "/var/run", "is"},
		{"/var/lib/kubelet", "/var/lib/kubelet", "is"},
		{"/var/lib/kubelet/pods", "/var/lib/kubelet", "lies under"},
		{"/var/lib", "/var/lib/cni", "contains"},
		{"/var", "/var/lib/cni", "contains"},
		{"/etc", "/etc/hostname", "contains"},
		{"/etc/resolv.conf", "/etc/resolv.conf", "is"},
		{"/proc/1", "/proc", "lies under"},
		{"/dev/mapper", "/dev", "lies under"},
		{"/sys/fs/cgroup", "/sys", "lies under"},
	} {
		err := (&KubernetesPolicy{AllowedHostPaths: []string{"/data/volumes", tc.path}}).Check()
		var pe *ProtectedHostPathError
		if !errors.As(err, &pe) || pe.Path != tc.path || pe.Protected != tc.protected || pe.How != tc.how {
			t.Errorf("allowing %s: %v; want a ProtectedHostPathError: %s %s", tc.path, err, tc.how, tc.protected)
			continue
		}
		if msg := err.Error(); !strings.Contains(msg, tc.path) || !strings.Contains(msg, "node state or secrets") || !strings.Contains(msg, layout.HostVolumesDir) {
			t.Errorf("the refusal does not say which path and why: %s", msg)
		}
	}
	for _, ok := range [][]string{nil, {layout.HostVolumesDir}, {"/data/volumes/db", "/data/volumes/x/y"}, {"/usr/share", "/database", "/lib/modules", "/etc/hosts"}} {
		if err := (&KubernetesPolicy{AllowedHostPaths: ok}).Check(); err != nil {
			t.Errorf("allowing %v: %v", ok, err)
		}
	}
	// Nothing the node keeps lies below the host volumes directory.
	for _, q := range layout.ProtectedHostPaths() {
		if under(q, layout.HostVolumesDir) {
			t.Errorf("protected path %s lies below %s", q, layout.HostVolumesDir)
		}
	}
}

// TestCheckExternalIPRanges: an allowed external IP range is a canonical
// CIDR that holds neither every address nor any the nodes use for
// themselves (loopback, link-local, the pod and Service networks), so
// a Service cannot be given one of those.
func TestCheckExternalIPRanges(t *testing.T) {
	for _, c := range []string{"192.0.2.0/28", "198.51.100.7/32", "2001:db8::/64", "203.0.113.0/24"} {
		if err := (&KubernetesPolicy{AllowedExternalIps: []string{c}}).Check(); err != nil {
			t.Errorf("allowing %s: %v", c, err)
		}
	}
	for c, want := range map[string]string{
		"192.0.2.1/28": "CIDR", "192.0.2.1": "CIDR", "example.org": "CIDR", "": "CIDR", "fe80::1%eth0/64": "CIDR",
		"0.0.0.0/0": "every address", "::/0": "every address",
		"127.0.0.1/32": "127.0.0.0/8", "10.0.0.0/8": layout.ClusterCIDR, "10.96.0.1/32": layout.ServiceCIDR,
		"169.254.53.53/32": "169.254.0.0/16", "fe80::/64": "fe80::/10", "::1/128": "::1/128",
	} {
		err := (&KubernetesPolicy{AllowedExternalIps: []string{"192.0.2.0/28", c}}).Check()
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("allowing %q: %v; want a refusal naming %q", c, err, want)
		}
	}
}
