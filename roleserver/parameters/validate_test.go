package parameters

import (
	"encoding/hex"
	"encoding/pem"
	"errors"
	"slices"
	"strings"
	"testing"

	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/proto"

	"plinth.dev/plinth/api/nodepb"
	"plinth.dev/plinth/platform/pki"
)

func TestValidateAcceptsFixtures(t *testing.T) {
	if err := Validate(bootstrapDoc()); err != nil {
		t.Errorf("bootstrap: %v", err)
	}
	if err := Validate(registerDoc(t)); err != nil {
		t.Errorf("register: %v", err)
	}
}

// The bootstrap owner key must be a real key, not only 32 bytes: a
// small-order or non-canonical point would let anyone sign as the owner.
func TestValidateRefusesWeakOwnerKey(t *testing.T) {
	for _, tc := range []struct {
		name, hex string
		want      error
	}{
		{"identity", "0100000000000000000000000000000000000000000000000000000000000000", pki.ErrKeySmallOrder},
		{"order 2", "ecffffffffffffffffffffffffffffffffffffffffffffffffffffffffffff7f", pki.ErrKeySmallOrder},
		{"order 4", "0000000000000000000000000000000000000000000000000000000000000000", pki.ErrKeySmallOrder},
		{"order 8", "26e8958fc2b227b045c3f489f2ef98f0d5dfac05d3c63339b13802886d53fc05", pki.ErrKeySmallOrder},
		{"non-canonical", "eeffffffffffffffffffffffffffffffffffffffffffffffffffffffffffff7f", pki.ErrKeyNotCanonical},
		{"not on the curve", "0200000000000000000000000000000000000000000000000000000000000000", pki.ErrKeyNotOnCurve},
	} {
		t.Run(tc.name, func(t *testing.T) {
			p := bootstrapDoc()
			p.GetBootstrap().OwnerPublicKey, _ = hex.DecodeString(tc.hex)
			err := Validate(p)
			if !errors.Is(err, tc.want) {
				t.Fatalf("Validate: %v, want %v", err, tc.want)
			}
			if !strings.Contains(err.Error(), "bootstrap.owner_public_key") {
				t.Errorf("error %q does not name the field", err)
			}
			if _, err := Encode(p); !errors.Is(err, tc.want) {
				t.Errorf("Encode: %v, want %v", err, tc.want)
			}
		})
	}
	// A normal key (the fixtures') passes.
	if err := Validate(bootstrapDoc()); err != nil {
		t.Errorf("normal owner key: %v", err)
	}
}

// Every Validate error, each from a document that is valid but for one
// mistake, so that the message is checked in isolation.
func TestValidateErrors(t *testing.T) {
	_, leaf := testCerts(t)
	boot := func(f func(p *nodepb.Parameters)) func(t *testing.T) *nodepb.Parameters {
		return func(t *testing.T) *nodepb.Parameters { p := bootstrapDoc(); f(p); return p }
	}
	reg := func(f func(r *nodepb.Register)) func(t *testing.T) *nodepb.Parameters {
		return func(t *testing.T) *nodepb.Parameters { p := registerDoc(t); f(p.GetRegister()); return p }
	}
	static := func(f func(s *nodepb.StaticConfig)) func(t *testing.T) *nodepb.Parameters {
		return boot(func(p *nodepb.Parameters) { f(p.Network.Static) })
	}
	for _, tc := range []struct {
		name string
		doc  func(t *testing.T) *nodepb.Parameters
		want string
	}{
		{"nil", func(*testing.T) *nodepb.Parameters { return nil }, "no document"},
		{"no cluster", boot(func(p *nodepb.Parameters) { p.Cluster = nil }), "neither bootstrap nor register"},

		{"owner key missing", boot(func(p *nodepb.Parameters) { p.GetBootstrap().OwnerPublicKey = nil }), "bootstrap.owner_public_key: 0 bytes"},
		{"owner key short", boot(func(p *nodepb.Parameters) { p.GetBootstrap().OwnerPublicKey = ownerKey[:31] }), "bootstrap.owner_public_key: 31 bytes"},
		{"owner key PKIX", boot(func(p *nodepb.Parameters) { p.GetBootstrap().OwnerPublicKey = make([]byte, 44) }), "bootstrap.owner_public_key: 44 bytes"},
		{"empty bootstrap", boot(func(p *nodepb.Parameters) {
			p.Cluster = &nodepb.Parameters_Bootstrap{Bootstrap: &nodepb.Bootstrap{}}
		}), "bootstrap.owner_public_key: 0 bytes"},

		{"CA missing", reg(func(r *nodepb.Register) { r.ClusterCaCertificate = nil }), "register.cluster_ca_certificate: missing"},
		{"CA garbage", reg(func(r *nodepb.Register) { r.ClusterCaCertificate = []byte{0x30, 0x03, 1, 2, 3} }), "not a DER X.509 certificate"},
		{"CA as PEM", reg(func(r *nodepb.Register) {
			r.ClusterCaCertificate = pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: r.ClusterCaCertificate})
		}), "this is PEM; give the DER bytes"},
		{"CA is a leaf", reg(func(r *nodepb.Register) { r.ClusterCaCertificate = leaf }), `"CN=curator" is not a CA certificate`},
		{"ticket missing", reg(func(r *nodepb.Register) { r.RegisterTicket = nil }), "register.register_ticket: missing"},
		{"no endpoints", reg(func(r *nodepb.Register) { r.CuratorEndpoints = nil }), "register.curator_endpoints: missing"},
		{"endpoint without port", reg(func(r *nodepb.Register) { r.CuratorEndpoints = []string{"10.0.0.1:1", "10.0.0.1"} }), `register.curator_endpoints[1] "10.0.0.1": want host:port`},
		{"endpoint without host", reg(func(r *nodepb.Register) { r.CuratorEndpoints = []string{":7835"} }), "host is empty"},
		{"endpoint port 0", reg(func(r *nodepb.Register) { r.CuratorEndpoints = []string{"a:0"} }), `port "0" is not a number`},
		{"endpoint port too big", reg(func(r *nodepb.Register) { r.CuratorEndpoints = []string{"a:65536"} }), `port "65536" is not a number`},
		{"endpoint port name", reg(func(r *nodepb.Register) { r.CuratorEndpoints = []string{"a:https"} }), `port "https" is not a number`},
		{"endpoint bare IPv6", reg(func(r *nodepb.Register) { r.CuratorEndpoints = []string{"2001:db8::1:7835"} }), "want host:port"},

		{"TPM disabled against policy", boot(func(p *nodepb.Parameters) {
			p.Tpm.Policy = nodepb.NodeTPM_TPM_POLICY_DISABLED_FOR_DEVELOPMENT
		}), "tpm.policy: TPM_POLICY_DISABLED_FOR_DEVELOPMENT, but bootstrap.initial_policy does not allow_nodes_without_tpm"},
		{"storage weaker than policy", boot(func(p *nodepb.Parameters) {
			p.GetBootstrap().InitialPolicy.StorageSecurity = nodepb.StorageSecurity_STORAGE_SECURITY_AUTHENTICATED
			p.Storage.Security = nodepb.StorageSecurity_STORAGE_SECURITY_ENCRYPTED
		}), "storage.security: STORAGE_SECURITY_ENCRYPTED is weaker than bootstrap.initial_policy.storage_security STORAGE_SECURITY_AUTHENTICATED"},
		{"unknown pod security level", boot(func(p *nodepb.Parameters) { p.GetBootstrap().InitialPolicy.PodSecurityLevel = "lax" }),
			`bootstrap.initial_policy: pod security level "lax"`},
		{"allowed host path /", boot(func(p *nodepb.Parameters) { p.GetBootstrap().InitialPolicy.AllowedHostPaths = []string{"/"} }),
			`bootstrap.initial_policy: allowed host path "/"`},
		{"allowed host path unclean", boot(func(p *nodepb.Parameters) { p.GetBootstrap().InitialPolicy.AllowedHostPaths = []string{"/data/../etc"} }),
			`allowed host path "/data/../etc"`},
		{"allowed host path quote", boot(func(p *nodepb.Parameters) {
			p.GetBootstrap().InitialPolicy.AllowedHostPaths = []string{"/data/x' || true"}
		}),
			`allowed host path "/data/x' || true"`},
		{"PCR 24", boot(func(p *nodepb.Parameters) { p.Tpm.SealPcrs = []uint32{7, 24} }), "tpm.seal_pcrs[1]: PCR 24 does not exist"},
		{"PCR duplicate", boot(func(p *nodepb.Parameters) { p.Tpm.SealPcrs = []uint32{7, 11, 7} }), "tpm.seal_pcrs[2]: PCR 7 listed twice"},

		{"unknown storage security", boot(func(p *nodepb.Parameters) { p.Storage.Security = 3 }), "storage.security: unknown value 3 for StorageSecurity"},
		{"unknown filesystem", boot(func(p *nodepb.Parameters) { p.Storage.Filesystem = 9 }), "storage.filesystem: unknown value 9 for Filesystem"},
		{"unknown TPM policy", boot(func(p *nodepb.Parameters) { p.Tpm.Policy = -1 }), "tpm.policy: unknown value -1 for TPMPolicy"},
		{"unknown policy storage security", boot(func(p *nodepb.Parameters) { p.GetBootstrap().InitialPolicy.StorageSecurity = 42 }),
			"bootstrap.initial_policy.storage_security: unknown value 42"},

		{"static without address", static(func(s *nodepb.StaticConfig) { s.Address = "" }), "network.static.address: missing"},
		{"address without prefix", static(func(s *nodepb.StaticConfig) { s.Address = "10.0.2.15" }), `network.static.address "10.0.2.15": not CIDR`},
		{"address not IP", static(func(s *nodepb.StaticConfig) { s.Address = "node/24" }), "not CIDR"},
		{"address unspecified", static(func(s *nodepb.StaticConfig) { s.Address = "0.0.0.0/0" }), "not a unicast host address"},
		{"gateway not IP", static(func(s *nodepb.StaticConfig) { s.Gateway = "router" }), `network.static.gateway "router": not an IP address`},
		{"gateway is CIDR", static(func(s *nodepb.StaticConfig) { s.Gateway = "10.0.2.2/24" }), "not an IP address"},
		{"gateway other family", static(func(s *nodepb.StaticConfig) { s.Gateway = "2001:db8::1" }), "not the same address family"},
		{"dns not IP", static(func(s *nodepb.StaticConfig) { s.Dns = []string{"1.1.1.1", "dns.example"} }), `network.static.dns[1] "dns.example": not an IP address`},
		{"interface too long", static(func(s *nodepb.StaticConfig) { s.Interface = "enp0s31f6abcdefgh" }), "at most 15"},
		{"interface with slash", static(func(s *nodepb.StaticConfig) { s.Interface = "eth/0" }), "not a valid interface name"},
		{"hostname uppercase", boot(func(p *nodepb.Parameters) { p.Network.Hostname = "Node-A" }), `network.hostname "Node-A": character 'N'`},
		{"hostname too long", boot(func(p *nodepb.Parameters) { p.Network.Hostname = strings.Repeat("a", 64) }), "64 characters, at most 63"},
		{"hostname dash", boot(func(p *nodepb.Parameters) { p.Network.Hostname = "-node" }), "starts or ends with '-'"},
		{"hostname empty label", boot(func(p *nodepb.Parameters) { p.Network.Hostname = "node..lab" }), "empty label"},

		{"data disk as a path", boot(func(p *nodepb.Parameters) { p.Storage.DataDisk = "/dev/vdb" }), `storage.data_disk "/dev/vdb": a path; give the kernel name without /dev/`},
		{"data disk with a space", boot(func(p *nodepb.Parameters) { p.Storage.DataDisk = "WD 123" }), `storage.data_disk "WD 123": character ' '`},
		{"data disk with a newline", boot(func(p *nodepb.Parameters) { p.Storage.DataDisk = "vdb\n" }), `character '\n'`},
		{"data disk not ASCII", boot(func(p *nodepb.Parameters) { p.Storage.DataDisk = "dïsk" }), `character 'ï'`},
		{"data disk too long", boot(func(p *nodepb.Parameters) { p.Storage.DataDisk = strings.Repeat("S", 65) }), "storage.data_disk \"" + strings.Repeat("S", 65) + "\": 65 characters, at most 64"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			err := Validate(tc.doc(t))
			if err == nil {
				t.Fatalf("Validate accepted it, want %q", tc.want)
			}
			if !strings.Contains(err.Error(), tc.want) {
				t.Errorf("error %q\nwant it to contain %q", err, tc.want)
			}
		})
	}
}

// storage.data_disk takes kernel names and serial numbers as disks report them.
func TestValidateDataDisk(t *testing.T) {
	for _, d := range []string{"", "vda", "vdb", "sda", "nvme0n1", "mmcblk0", "QM00001", "S4EVNX0N123456K", "WD-WCC4N7KJ1234", "plinth-second", "0000:00:1f.2", strings.Repeat("S", 64)} {
		p := bootstrapDoc()
		p.Storage.DataDisk = d
		if err := Validate(p); err != nil {
			t.Errorf("%q: %v", d, err)
		}
	}
}

// Unknown fields are what a newer plinthctl writes; the node must not
// silently ignore them.
func TestDecodeRejectsUnknownFields(t *testing.T) {
	for name, tc := range map[string]struct {
		extra []byte
		want  string
	}{
		"top level": {protowire.AppendString(protowire.AppendTag(nil, 99, protowire.BytesType), "new"), "document: has fields"},
		"nested": {func() []byte {
			inner := protowire.AppendVarint(protowire.AppendTag(nil, 9, protowire.VarintType), 1)
			return protowire.AppendBytes(protowire.AppendTag(nil, 4, protowire.BytesType), inner)
		}(), "tpm: has fields"},
	} {
		t.Run(name, func(t *testing.T) {
			raw := append(mustMarshal(t, bootstrapDoc()), tc.extra...)
			_, err := Decode(raw)
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Errorf("Decode = %v, want %q", err, tc.want)
			}
		})
	}
}

// All problems are reported at once, not just the first.
func TestValidateReportsAll(t *testing.T) {
	p := registerDoc(t)
	p.GetRegister().RegisterTicket = nil
	p.GetRegister().CuratorEndpoints = []string{"x"}
	p.Tpm = &nodepb.NodeTPM{SealPcrs: []uint32{30}}
	err := Validate(p)
	for _, want := range []string{"register_ticket", "curator_endpoints[0]", "seal_pcrs[0]"} {
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("error %v does not mention %s", err, want)
		}
	}
	if n := len(err.(interface{ Unwrap() []error }).Unwrap()); n != 3 {
		t.Errorf("%d errors, want 3", n)
	}
	if errors.Is(err, ErrNotFound) {
		t.Error("invalid is not missing")
	}
}

func TestDefaults(t *testing.T) {
	p := &nodepb.Parameters{Cluster: &nodepb.Parameters_Bootstrap{Bootstrap: &nodepb.Bootstrap{OwnerPublicKey: ownerKey}}}
	Defaults(p)
	if p.Storage.Security != nodepb.StorageSecurity_STORAGE_SECURITY_ENCRYPTED ||
		p.Storage.Filesystem != nodepb.NodeStorage_FILESYSTEM_EXT4 ||
		p.Tpm.Policy != nodepb.NodeTPM_TPM_POLICY_REQUIRED ||
		!slices.Equal(p.Tpm.SealPcrs, []uint32{4, 7, 11, 12, 15}) {
		t.Errorf("defaults: %v", p)
	}
	if p.Network != nil {
		t.Error("Defaults invented a network config; absent means DHCP")
	}
	if err := Validate(p); err != nil {
		t.Errorf("defaulted document is invalid: %v", err)
	}

	// Explicit choices stay.
	q := bootstrapDoc()
	q.Storage.Security = nodepb.StorageSecurity_STORAGE_SECURITY_AUTHENTICATED
	q.Tpm.Policy = nodepb.NodeTPM_TPM_POLICY_DISABLED_FOR_DEVELOPMENT
	want := proto.Clone(q).(*nodepb.Parameters)
	Defaults(q)
	if !proto.Equal(q, want) {
		t.Errorf("Defaults changed explicit settings:\n got %v\nwant %v", q, want)
	}

	// The default never falls short of the bootstrap policy.
	r := bootstrapDoc()
	r.Storage = nil
	r.GetBootstrap().InitialPolicy.StorageSecurity = nodepb.StorageSecurity_STORAGE_SECURITY_AUTHENTICATED
	Defaults(r)
	if r.Storage.Security != nodepb.StorageSecurity_STORAGE_SECURITY_AUTHENTICATED {
		t.Errorf("storage security %v, want the policy's AUTHENTICATED", r.Storage.Security)
	}

	// DefaultSealPCRs hands out a fresh slice each time.
	p.Tpm.SealPcrs[0] = 99
	if DefaultSealPCRs()[0] != 4 {
		t.Error("DefaultSealPCRs shares its slice")
	}
	Defaults(nil) // must not panic
}
