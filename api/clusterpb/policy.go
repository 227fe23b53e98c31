package clusterpb

import (
	"crypto/ed25519"
	"fmt"
	"net/netip"
	"path"
	"slices"
	"strings"

	"plinth.dev/plinth/platform/layout"
)

// PodSecurityLevels are the Pod Security levels KubernetesPolicy may name.
var PodSecurityLevels = []string{"privileged", "baseline", "restricted"}

// Check reports what is wrong with the policy, if anything: an unknown
// Pod Security level, or an allowed host path that is not clean and
// absolute (or is / itself, which would allow everything), or that would
// open node state or secrets to pods (a *ProtectedHostPathError), or an
// external IP range that is not one (CheckExternalIPRange). The
// API servers' admission configuration is generated from it, so the
// curator refuses a bad policy before storing it.
func (p *KubernetesPolicy) Check() error {
	if l := p.GetPodSecurityLevel(); l != "" && !slices.Contains(PodSecurityLevels, l) {
		return fmt.Errorf("pod security level %q: want one of %s", l, strings.Join(PodSecurityLevels, ", "))
	}
	for _, a := range p.GetAllowedHostPaths() {
		if !CleanHostPath(a) {
			return fmt.Errorf("allowed host path %q: want a clean absolute path other than /, of letters, digits and ._-/ only", a)
		}
		if err := checkAllowedHostPath(a); err != nil {
			return err
		}
	}
	for _, c := range p.GetAllowedExternalIps() {
		if err := CheckExternalIPRange(c); err != nil {
			return err
		}
	}
	hosts := map[string]bool{}
	for _, r := range p.GetImageRegistries() {
		if err := r.Check(); err != nil {
			return err
		}
		if hosts[r.GetHost()] {
			return fmt.Errorf("image registry %s: named twice", r.GetHost())
		}
		hosts[r.GetHost()] = true
	}
	return nil
}

// ProtectedHostPathError is Check's refusal of an allowed host path that
// is, contains or lies under a protected one (layout.ProtectedHostPaths)
// outside layout.HostVolumesDir: a pod given it could read the node's
// credentials or reach its etcd member.
type ProtectedHostPathError struct {
	Path      string // the allowed path
	Protected string // the protected path it meets
	How       string // "is", "contains" or "lies under"
}

func (e *ProtectedHostPathError) Error() string {
	return fmt.Sprintf("allowed host path %s %s %s, which holds node state or secrets (a pod with it could read the node's credentials "+
		"or reach its etcd member); below the protected paths, only %s and what lies under it may be allowed",
		e.Path, e.How, e.Protected, layout.HostVolumesDir)
}

// checkAllowedHostPath refuses a (clean, absolute) allowed host path
// that would open a protected one. The admission policy holds the same
// line on its own (an allowed path opens nothing outside
// layout.HostVolumesDir), so a policy that got past this check anyway
// still opens nothing of the node's.
func checkAllowedHostPath(a string) error {
	if under(a, layout.HostVolumesDir) {
		return nil
	}
	for _, q := range layout.ProtectedHostPaths() {
		switch {
		case a == q:
			return &ProtectedHostPathError{Path: a, Protected: q, How: "is"}
		case under(a, q):
			return &ProtectedHostPathError{Path: a, Protected: q, How: "lies under"}
		case under(q, a):
			return &ProtectedHostPathError{Path: a, Protected: q, How: "contains"}
		}
	}
	return nil
}

// under reports whether the clean absolute path p is dir or below it
// (/database is not below /data).
func under(p, dir string) bool {
	return p == dir || dir == "/" || strings.HasPrefix(p, dir+"/")
}

// CleanHostPath reports whether p is a clean absolute path other than /
// made of letters, digits and "._-/" (so that it can be put into a
// policy's expression as it is).
func CleanHostPath(p string) bool {
	return path.IsAbs(p) && path.Clean(p) == p && p != "/" &&
		strings.IndexFunc(p, func(r rune) bool {
			return !(r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z' || r >= '0' && r <= '9' || strings.ContainsRune("._-/", r))
		}) < 0
}

// CheckReleaseKey reports whether k is an ed25519 public key.
func CheckReleaseKey(k []byte) error {
	if len(k) != ed25519.PublicKeySize {
		return fmt.Errorf("release key of %d bytes, want an ed25519 public key (%d)", len(k), ed25519.PublicKeySize)
	}
	return nil
}

// CheckExternalIPRange reports whether c may be an allowed range of
// Service external IPs: a CIDR in canonical form ("192.0.2.0/28", its
// address the range's first), not a default route, and meeting none of
// the ranges a node uses for itself (loopback, link-local, the pod and
// Service networks), where a Service's address would capture what the
// nodes send there. The node addresses themselves are the owner's to
// keep out: the range's documentation says so.
func CheckExternalIPRange(c string) error {
	p, err := netip.ParsePrefix(c)
	if err != nil || p != p.Masked() || p.Addr().Zone() != "" {
		return fmt.Errorf("allowed external IP range %q: want a CIDR whose address is its first (192.0.2.0/28, 2001:db8::/64)", c)
	}
	if p.Bits() == 0 {
		return fmt.Errorf("allowed external IP range %s holds every address: name the ranges Services may use", c)
	}
	for _, r := range []string{"127.0.0.0/8", "::1/128", "169.254.0.0/16", "fe80::/10", "0.0.0.0/8", "224.0.0.0/4", "ff00::/8", layout.ClusterCIDR, layout.ServiceCIDR} {
		if q := netip.MustParsePrefix(r); q.Overlaps(p) {
			return fmt.Errorf("allowed external IP range %s meets %s, which the nodes use themselves", c, r)
		}
	}
	return nil
}
