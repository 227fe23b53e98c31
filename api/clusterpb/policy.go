package clusterpb

import (
	"crypto/ed25519"
	"fmt"
	"path"
	"slices"
	"strings"
)

// PodSecurityLevels are the Pod Security levels KubernetesPolicy may name.
var PodSecurityLevels = []string{"privileged", "baseline", "restricted"}

// Check reports what is wrong with the policy, if anything: an unknown
// Pod Security level, or an allowed host path that is not clean and
// absolute (or is / itself, which would allow everything). The API
// servers' admission configuration is generated from it, so the curator
// refuses a bad policy before storing it.
func (p *KubernetesPolicy) Check() error {
	if l := p.GetPodSecurityLevel(); l != "" && !slices.Contains(PodSecurityLevels, l) {
		return fmt.Errorf("pod security level %q: want one of %s", l, strings.Join(PodSecurityLevels, ", "))
	}
	for _, a := range p.GetAllowedHostPaths() {
		if !CleanHostPath(a) {
			return fmt.Errorf("allowed host path %q: want a clean absolute path other than /, of letters, digits and ._-/ only", a)
		}
	}
	return nil
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
