package parameters

import (
	"crypto/ed25519"
	"crypto/x509"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"strconv"
	"strings"

	"google.golang.org/protobuf/reflect/protoreflect"

	"plinth.dev/plinth/api/clusterpb"
	"plinth.dev/plinth/api/nodepb"
	"plinth.dev/plinth/platform/measure"
	"plinth.dev/plinth/platform/pki"
)

// maxPCR is one past the highest PCR index of a PC Client TPM (24 PCRs).
const maxPCR = 24

// DefaultSealPCRs are the PCRs the node unlock key is sealed to when the
// document names none: measure.DefaultSealPCRs (the firmware's measurement
// of the UKI (4), the Secure Boot state (7), the UKI stub's measurements of
// kernel, initrd and command line (11), a command line passed to the stub
// instead (12), and the PCR /init extends with the node parameters and the
// system image root hash (15)).
func DefaultSealPCRs() []uint32 {
	out := make([]uint32, len(measure.DefaultSealPCRs))
	for i, p := range measure.DefaultSealPCRs {
		out[i] = uint32(p)
	}
	return out
}

// Validate checks everything that can be checked without a cluster. The
// error lists every problem found, each prefixed with its field as named in
// parameters.proto, so that an operator can fix a document in one go.
func Validate(p *nodepb.Parameters) error {
	if p == nil {
		return errors.New("no document")
	}
	var errs []error
	add := func(format string, a ...any) { errs = append(errs, fmt.Errorf(format, a...)) }

	// Generic checks first: they apply to every field, including ones added
	// to the .proto later without a matching check here.
	checkWire(p.ProtoReflect(), "", add)

	switch c := p.GetCluster().(type) {
	case nil:
		add("neither bootstrap nor register is set: the node must be told whether to found a new cluster or join an existing one")
	case *nodepb.Parameters_Bootstrap:
		validateBootstrap(c.Bootstrap, add)
	case *nodepb.Parameters_Register:
		validateRegister(c.Register, add)
	}
	validateAgainstPolicy(p, add)
	validateTPM(p.GetTpm(), add)
	validateNetwork(p.GetNetwork(), add)
	if d := p.GetStorage().GetDataDisk(); d != "" {
		if err := checkDiskName(d); err != nil {
			add("storage.data_disk %q: %v; want a kernel disk name (vda, nvme0n1) or the disk's serial number", d, err)
		}
	}
	return errors.Join(errs...)
}

type adder func(format string, a ...any)

// checkWire rejects unknown fields and enum values that parameters.proto
// does not define. Both are what a newer plinthctl would write; a node that
// ignored them would silently skip something the operator asked for (a
// stronger storage mode, say), so it refuses instead.
func checkWire(m protoreflect.Message, path string, add adder) {
	if len(m.GetUnknown()) > 0 {
		where := path
		if where == "" {
			where = "document"
		}
		add("%s: has fields this node does not know (made by a newer plinthctl?)", where)
	}
	m.Range(func(fd protoreflect.FieldDescriptor, v protoreflect.Value) bool {
		name := string(fd.Name())
		if path != "" {
			name = path + "." + name
		}
		switch {
		case fd.IsMap():
			// parameters.proto has no maps; nothing to walk.
		case fd.IsList():
			l := v.List()
			for i := 0; i < l.Len(); i++ {
				checkValue(fd, l.Get(i), fmt.Sprintf("%s[%d]", name, i), add)
			}
		default:
			checkValue(fd, v, name, add)
		}
		return true
	})
}

func checkValue(fd protoreflect.FieldDescriptor, v protoreflect.Value, path string, add adder) {
	switch fd.Kind() {
	case protoreflect.MessageKind, protoreflect.GroupKind:
		checkWire(v.Message(), path, add)
	case protoreflect.EnumKind:
		if fd.Enum().Values().ByNumber(v.Enum()) == nil {
			add("%s: unknown value %d for %s", path, v.Enum(), fd.Enum().Name())
		}
	}
}

func validateBootstrap(b *nodepb.Bootstrap, add adder) {
	if n := len(b.GetOwnerPublicKey()); n != ed25519.PublicKeySize {
		add("bootstrap.owner_public_key: %d bytes, want a raw %d-byte ed25519 public key", n, ed25519.PublicKeySize)
	} else if err := pki.CheckEd25519PublicKey(b.GetOwnerPublicKey()); err != nil {
		// Whoever could forge the owner's signatures would own the cluster.
		add("bootstrap.owner_public_key: refused, anyone could sign as this owner: %w", err)
	}
	pol := b.GetInitialPolicy()
	k := &clusterpb.KubernetesPolicy{PodSecurityLevel: pol.GetPodSecurityLevel(), AllowedHostPaths: pol.GetAllowedHostPaths()}
	if err := k.Check(); err != nil {
		add("bootstrap.initial_policy: %w", err)
	}
}

func validateRegister(r *nodepb.Register, add adder) {
	if der := r.GetClusterCaCertificate(); len(der) == 0 {
		add("register.cluster_ca_certificate: missing")
	} else if cert, err := x509.ParseCertificate(der); err != nil {
		hint := ""
		if strings.HasPrefix(string(der), "-----BEGIN") {
			hint = " (this is PEM; give the DER bytes)"
		}
		add("register.cluster_ca_certificate: not a DER X.509 certificate%s: %v", hint, err)
	} else if !cert.IsCA {
		// Likely a node or curator certificate given by mistake; the node
		// would then trust nothing, or the wrong thing.
		add("register.cluster_ca_certificate: %q is not a CA certificate", cert.Subject.String())
	}
	if len(r.GetRegisterTicket()) == 0 {
		add("register.register_ticket: missing")
	}
	if len(r.GetCuratorEndpoints()) == 0 {
		add("register.curator_endpoints: missing, need at least one host:port")
	}
	for i, ep := range r.GetCuratorEndpoints() {
		if err := checkHostPort(ep); err != nil {
			add("register.curator_endpoints[%d] %q: %v", i, ep, err)
		}
	}
}

func checkHostPort(s string) error {
	host, port, err := net.SplitHostPort(s)
	if err != nil {
		return fmt.Errorf("want host:port: %v", err)
	}
	if host == "" {
		return errors.New("want host:port, host is empty")
	}
	if n, err := strconv.ParseUint(port, 10, 16); err != nil || n == 0 {
		return fmt.Errorf("port %q is not a number from 1 to 65535", port)
	}
	return nil
}

// validateAgainstPolicy rejects a bootstrap node that would break the policy
// of the cluster it founds: the cluster would have to refuse its own first
// member. A registering node does not know the policy yet; the curator
// checks it.
func validateAgainstPolicy(p *nodepb.Parameters, add adder) {
	pol := p.GetBootstrap().GetInitialPolicy()
	if pol == nil {
		return
	}
	if !pol.GetAllowNodesWithoutTpm() && p.GetTpm().GetPolicy() == nodepb.NodeTPM_TPM_POLICY_DISABLED_FOR_DEVELOPMENT {
		add("tpm.policy: TPM_POLICY_DISABLED_FOR_DEVELOPMENT, but bootstrap.initial_policy does not allow_nodes_without_tpm")
	}
	want, got := pol.GetStorageSecurity(), p.GetStorage().GetSecurity()
	if want != nodepb.StorageSecurity_STORAGE_SECURITY_UNSPECIFIED &&
		got != nodepb.StorageSecurity_STORAGE_SECURITY_UNSPECIFIED && got < want &&
		known(got) && known(want) {
		add("storage.security: %v is weaker than bootstrap.initial_policy.storage_security %v", got, want)
	}
}

func known(s nodepb.StorageSecurity) bool {
	return s.Descriptor().Values().ByNumber(s.Number()) != nil
}

func validateTPM(t *nodepb.NodeTPM, add adder) {
	seen := map[uint32]bool{}
	for i, pcr := range t.GetSealPcrs() {
		if pcr >= maxPCR {
			add("tpm.seal_pcrs[%d]: PCR %d does not exist, want 0 to %d", i, pcr, maxPCR-1)
		} else if seen[pcr] {
			add("tpm.seal_pcrs[%d]: PCR %d listed twice", i, pcr)
		}
		seen[pcr] = true
	}
}

func validateNetwork(n *nodepb.Network, add adder) {
	if h := n.GetHostname(); h != "" {
		if err := checkHostname(h); err != nil {
			add("network.hostname %q: %v", h, err)
		}
	}
	s := n.GetStatic()
	if s == nil {
		return
	}
	if s.GetInterface() != "" {
		if err := checkIfName(s.GetInterface()); err != nil {
			add("network.static.interface %q: %v", s.GetInterface(), err)
		}
	}
	var addr netip.Prefix
	if s.GetAddress() == "" {
		add("network.static.address: missing (want CIDR, e.g. 10.0.0.5/24); leave network.static unset for DHCP")
	} else if a, err := netip.ParsePrefix(s.GetAddress()); err != nil {
		add("network.static.address %q: not CIDR (want e.g. 10.0.0.5/24): %v", s.GetAddress(), err)
	} else if a.Addr().IsUnspecified() || a.Addr().IsMulticast() {
		add("network.static.address %q: not a unicast host address", s.GetAddress())
	} else {
		addr = a
	}
	if g := s.GetGateway(); g != "" {
		if gw, err := netip.ParseAddr(g); err != nil {
			add("network.static.gateway %q: not an IP address", g)
		} else if addr.IsValid() && gw.Unmap().Is4() != addr.Addr().Unmap().Is4() {
			add("network.static.gateway %q: not the same address family as network.static.address %q", g, s.GetAddress())
		}
	}
	for i, d := range s.GetDns() {
		if _, err := netip.ParseAddr(d); err != nil {
			add("network.static.dns[%d] %q: not an IP address", i, d)
		}
	}
}

// checkHostname accepts lowercase RFC 1123 names that also work as a
// Kubernetes node name and fit a single DNS label's length, so that the
// same name serves the kernel, DHCP and the cluster.
func checkHostname(h string) error {
	if len(h) > 63 {
		return fmt.Errorf("%d characters, at most 63", len(h))
	}
	for label := range strings.SplitSeq(h, ".") {
		if label == "" {
			return errors.New("empty label")
		}
		if label[0] == '-' || label[len(label)-1] == '-' {
			return errors.New("a label starts or ends with '-'")
		}
		for _, r := range label {
			if !(r >= 'a' && r <= 'z' || r >= '0' && r <= '9' || r == '-') {
				return fmt.Errorf("character %q, want lowercase letters, digits, '-' and '.'", r)
			}
		}
	}
	return nil
}

// checkIfName applies the kernel's dev_valid_name rules, so that a bad name
// fails here with a message instead of at boot with EINVAL.
func checkIfName(s string) error {
	if len(s) > 15 {
		return fmt.Errorf("%d characters, at most 15", len(s))
	}
	if s == "." || s == ".." || strings.ContainsAny(s, "/: \t\n") {
		return errors.New("not a valid interface name")
	}
	return nil
}

// maxDiskName bounds storage.data_disk: kernel disk names are short, and
// serial numbers are at most 20 (ATA, NVMe, virtio) to 64 characters.
const maxDiskName = 64

// checkDiskName accepts what the node compares with a disk's kernel name
// and serial number: printable, no spaces, no path. A path or a name with
// a partition number would match nothing and leave the node waiting, so
// it fails here with a message instead.
func checkDiskName(s string) error {
	if len(s) > maxDiskName {
		return fmt.Errorf("%d characters, at most %d", len(s), maxDiskName)
	}
	if strings.HasPrefix(s, "/") {
		return errors.New("a path; give the kernel name without /dev/ (vda, not /dev/vda)")
	}
	for _, r := range s {
		if !(r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z' || r >= '0' && r <= '9' || strings.ContainsRune("-_.:+", r)) {
			return fmt.Errorf("character %q, want letters, digits and - _ . : +", r)
		}
	}
	return nil
}

// Defaults fills in what the document left unset, in place. It follows the
// bootstrap cluster policy where there is one, so that a defaulted node
// never falls short of the cluster it founds.
func Defaults(p *nodepb.Parameters) {
	if p == nil {
		return
	}
	if p.Storage == nil {
		p.Storage = &nodepb.NodeStorage{}
	}
	if p.Storage.Security == nodepb.StorageSecurity_STORAGE_SECURITY_UNSPECIFIED {
		p.Storage.Security = nodepb.StorageSecurity_STORAGE_SECURITY_ENCRYPTED
		if pol := p.GetBootstrap().GetInitialPolicy().GetStorageSecurity(); pol > p.Storage.Security && known(pol) {
			p.Storage.Security = pol
		}
	}
	if p.Storage.Filesystem == nodepb.NodeStorage_FILESYSTEM_UNSPECIFIED {
		p.Storage.Filesystem = nodepb.NodeStorage_FILESYSTEM_EXT4
	}
	if p.Tpm == nil {
		p.Tpm = &nodepb.NodeTPM{}
	}
	if p.Tpm.Policy == nodepb.NodeTPM_TPM_POLICY_UNSPECIFIED {
		p.Tpm.Policy = nodepb.NodeTPM_TPM_POLICY_REQUIRED
	}
	if len(p.Tpm.SealPcrs) == 0 {
		p.Tpm.SealPcrs = DefaultSealPCRs()
	}
}
