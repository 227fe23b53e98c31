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
		{"/etc/hosts", "/etc/hosts", "is"},
		{"/tmp", "/tmp", "is"},
		{"/tmp/x", "/tmp", "lies under"},
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
	for _, ok := range [][]string{nil, {layout.HostVolumesDir}, {"/data/volumes/db", "/data/volumes/x/y"}, {"/usr/share", "/database", "/lib/modules"}} {
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
