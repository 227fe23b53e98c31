package main

import (
	"bytes"
	"context"
	"crypto/ed25519"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/base64"
	"encoding/binary"
	"encoding/pem"
	"errors"
	"math/big"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"plinth.dev/plinth/api/nodepb"
	"plinth.dev/plinth/platform/pki"
	"plinth.dev/plinth/roleserver/owner"
	"plinth.dev/plinth/roleserver/parameters"
)

// params runs plinthctl params as main would and decodes what it wrote
// to FILE, the first argument.
func params(t *testing.T, args ...string) (*nodepb.Parameters, string) {
	t.Helper()
	stdout, _ := ctl(t, append([]string{"params"}, args...)...)
	raw, err := os.ReadFile(args[0])
	if err != nil {
		t.Fatal(err)
	}
	p, err := parameters.Decode(raw)
	if err != nil {
		t.Fatalf("written document does not decode: %v", err)
	}
	return p, stdout
}

func TestParamsBootstrapNewKey(t *testing.T) {
	dir := t.TempDir()
	out := filepath.Join(dir, "node", "params.pb")
	p, stdout := params(t, out, "--bootstrap", "--storage", "authenticated", "--fs", "xfs",
		"--seal-pcrs", "7,11,15", "--hostname", "node-a", "--static-address", "10.0.2.15/24",
		"--gateway", "10.0.2.2", "--dns", "10.0.2.3,10.0.2.4", "--print-cmdline")

	b := p.GetBootstrap()
	if b == nil || b.GetInitialPolicy().GetAllowNodesWithoutTpm() {
		t.Fatalf("want bootstrap with a TPM-requiring policy, got %v", p)
	}
	if p.GetStorage().GetSecurity() != nodepb.StorageSecurity_STORAGE_SECURITY_AUTHENTICATED ||
		p.GetStorage().GetFilesystem() != nodepb.NodeStorage_FILESYSTEM_XFS ||
		!slices.Equal(p.GetTpm().GetSealPcrs(), []uint32{7, 11, 15}) ||
		p.GetNetwork().GetHostname() != "node-a" ||
		p.GetNetwork().GetStatic().GetGateway() != "10.0.2.2" ||
		!slices.Equal(p.GetNetwork().GetStatic().GetDns(), []string{"10.0.2.3", "10.0.2.4"}) {
		t.Errorf("document does not match the flags: %v", p)
	}

	// The generated private key matches the public key in the document.
	keyPath := filepath.Join(dir, "node", ownerKeyFile)
	st, err := os.Stat(keyPath)
	if err != nil {
		t.Fatal(err)
	}
	if st.Mode().Perm() != 0o600 {
		t.Errorf("%s mode %v, want 0600", ownerKeyFile, st.Mode().Perm())
	}
	pemBytes, _ := os.ReadFile(keyPath)
	blk, _ := pem.Decode(pemBytes)
	if blk == nil || blk.Type != "PRIVATE KEY" {
		t.Fatalf("%s is not a PKCS#8 PEM", ownerKeyFile)
	}
	k, err := x509.ParsePKCS8PrivateKey(blk.Bytes)
	if err != nil {
		t.Fatal(err)
	}
	if priv, ok := k.(ed25519.PrivateKey); !ok || !bytes.Equal(priv.Public().(ed25519.PublicKey), b.GetOwnerPublicKey()) {
		t.Error("owner.key does not match the document's owner_public_key")
	}

	// --print-cmdline prints the kernel argument for the same bytes.
	raw, _ := os.ReadFile(out)
	if want := parameters.CmdlineKey + "=" + parameters.CmdlineValue(raw) + "\n"; stdout != want {
		t.Errorf("stdout %q, want %q", stdout, want)
	}

	// owner.pub feeds a second node's document, and an existing owner.key
	// is never replaced.
	pub := filepath.Join(dir, "node", ownerPubFile)
	p2, _ := params(t, filepath.Join(dir, "node", "again.pb"), "--bootstrap", "--owner-key", pub)
	if !bytes.Equal(p2.GetBootstrap().GetOwnerPublicKey(), b.GetOwnerPublicKey()) {
		t.Error("--owner-key owner.pub gave a different key")
	}
	_, stderr, code := runCLI("params", filepath.Join(dir, "node", "third.pb"), "--bootstrap")
	if code != 1 || !strings.Contains(stderr, "already exists") {
		t.Errorf("second key generation in the same directory: exit %d, %s", code, stderr)
	}
	if after, _ := os.ReadFile(keyPath); !bytes.Equal(after, pemBytes) {
		t.Error("owner.key was replaced")
	}
}

func TestParamsOwnerKeyForms(t *testing.T) {
	dir := t.TempDir()
	pub, _, _ := ed25519.GenerateKey(rand.Reader)
	blob := binary.BigEndian.AppendUint32(nil, 11)
	blob = append(blob, "ssh-ed25519"...)
	blob = binary.BigEndian.AppendUint32(blob, 32)
	blob = append(blob, pub...)
	forms := map[string][]byte{
		"raw": pub,
		"ssh": []byte("ssh-ed25519 " + base64.StdEncoding.EncodeToString(blob) + " owner@laptop\n"),
	}
	for name, content := range forms {
		f := filepath.Join(dir, name)
		os.WriteFile(f, content, 0o644)
		p, _ := params(t, filepath.Join(dir, name+".pb"), "--bootstrap", "--owner-key", f, "--tpm", "disabled", "--policy-tpm-required=false")
		if !bytes.Equal(p.GetBootstrap().GetOwnerPublicKey(), pub) {
			t.Errorf("%s: wrong key", name)
		}
		if p.GetTpm().GetPolicy() != nodepb.NodeTPM_TPM_POLICY_DISABLED_FOR_DEVELOPMENT || !p.GetBootstrap().GetInitialPolicy().GetAllowNodesWithoutTpm() {
			t.Errorf("%s: TPM settings %v", name, p)
		}
	}
	if _, err := os.Stat(filepath.Join(dir, ownerKeyFile)); err == nil {
		t.Error("a key pair was generated although --owner-key was given")
	}
}

func TestParamsRegister(t *testing.T) {
	dir := t.TempDir()
	key := ed25519.NewKeyFromSeed(make([]byte, 32))
	tmpl := &x509.Certificate{
		SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "cluster CA"},
		NotBefore: time.Now(), NotAfter: time.Now().Add(time.Hour),
		IsCA: true, BasicConstraintsValid: true, KeyUsage: x509.KeyUsageCertSign,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, key.Public(), key)
	if err != nil {
		t.Fatal(err)
	}
	caDER := filepath.Join(dir, "ca.der")
	caPEM := filepath.Join(dir, "ca.pem")
	os.WriteFile(caDER, der, 0o644)
	os.WriteFile(caPEM, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}), 0o644)

	for _, ca := range []string{caDER, caPEM} {
		out := filepath.Join(dir, "reg.pb")
		p, _ := params(t, out, "--register", "--ca", ca, "--ticket", "tkt",
			"--curator", "10.0.0.1:7835", "--curator", "10.0.0.2:7835,10.0.0.3:7835", "--tpm", "required")
		r := p.GetRegister()
		if r == nil || !bytes.Equal(r.GetClusterCaCertificate(), der) || string(r.GetRegisterTicket()) != "tkt" ||
			!slices.Equal(r.GetCuratorEndpoints(), []string{"10.0.0.1:7835", "10.0.0.2:7835", "10.0.0.3:7835"}) ||
			p.GetTpm().GetPolicy() != nodepb.NodeTPM_TPM_POLICY_REQUIRED {
			t.Errorf("document does not match the flags: %v", p)
		}
		if st, _ := os.Stat(out); st.Mode().Perm() != 0o600 {
			t.Errorf("document mode %v, want 0600 (it holds the ticket)", st.Mode().Perm())
		}
	}
	if _, err := os.Stat(filepath.Join(dir, ownerKeyFile)); err == nil {
		t.Error("register made an owner key")
	}
}

// Bad flags and invalid documents fail before anything is written:
// wrong usage exits 2, a document that does not validate 1.
func TestParamsErrors(t *testing.T) {
	for _, tc := range []struct {
		args []string
		code int
		want string
	}{
		{[]string{"--bootstrap"}, 2, "the output file is required"},
		{[]string{"F", "--file", "F", "--bootstrap"}, 2, "not both"},
		{[]string{"F"}, 2, "exactly one of --bootstrap and --register"},
		{[]string{"F", "--bootstrap", "--register"}, 2, "exactly one of --bootstrap and --register"},
		{[]string{"--file", "F", "--bootstrap", "--register"}, 2, "exactly one of --bootstrap and --register"},
		{[]string{"F", "--bootstrap", "--ticket", "x"}, 2, "--ticket only applies with --register"},
		{[]string{"F", "--register", "--owner-key", "x"}, 2, "--owner-key only applies with --bootstrap"},
		{[]string{"F", "--bootstrap", "--gateway", "10.0.0.1"}, 2, "--gateway only applies with --static-address"},
		{[]string{"F", "--register", "--ticket", "t", "--curator", "a:1"}, 1, "register.cluster_ca_certificate: missing"},
		{[]string{"F", "--bootstrap", "--tpm", "off"}, 2, `--tpm "off"`},
		{[]string{"F", "--bootstrap", "--tpm", "disabled"}, 2, "add --policy-tpm-required=false"},
		{[]string{"F", "--bootstrap", "--storage", "plain"}, 2, `--storage: "plain"`},
		{[]string{"F", "--bootstrap", "--fs", "btrfs"}, 2, `--fs: "btrfs"`},
		{[]string{"F", "--bootstrap", "--seal-pcrs", "7,x"}, 2, `"x" is not a PCR number`},
		{[]string{"F", "--bootstrap", "--seal-pcrs", "7,30"}, 1, "PCR 30 does not exist"},
		{[]string{"F", "--bootstrap", "--static-address", "10.0.0.5"}, 1, "not CIDR"},
		{[]string{"F", "--bootstrap", "stray"}, 2, "unexpected arguments"},
		{[]string{"F", "--bootstrap", "-o", "json"}, 2, "prints no object"},
		{[]string{"F", "-bootstrap"}, 2, "--bootstrap, not -bootstrap"},
	} {
		dir := t.TempDir()
		args := slices.Clone(tc.args)
		for i, a := range args {
			if a == "F" {
				args[i] = filepath.Join(dir, "params.pb")
			}
		}
		_, stderr, code := runCLI(append([]string{"params"}, args...)...)
		if code != tc.code || !strings.Contains(stderr, tc.want) {
			t.Errorf("%v: exit %d, %s\nwant exit %d, %q", tc.args, code, stderr, tc.code, tc.want)
		}
		if ents, _ := os.ReadDir(dir); len(ents) != 0 {
			t.Errorf("%v: left files behind: %v", tc.args, ents)
		}
	}
}

// The output file is the FILE argument or --file FILE, alike.
func TestParamsFileSpellings(t *testing.T) {
	dir := t.TempDir()
	for _, args := range [][]string{{filepath.Join(dir, "a", "p.pb")}, {"--file", filepath.Join(dir, "b", "p.pb")}} {
		ctl(t, append([]string{"params", "--bootstrap"}, args...)...)
		raw, err := os.ReadFile(args[len(args)-1])
		if err != nil {
			t.Fatalf("%v: %v", args, err)
		}
		if _, err := parameters.Decode(raw); err != nil {
			t.Errorf("%v: %v", args, err)
		}
	}
}

// params --register without --ca/--ticket/--curator takes them from the
// cluster, with the configuration dir given (the global --config).
func TestParamsRegisterFromCluster(t *testing.T) {
	ca, err := pki.NewCA("cluster", 0)
	if err != nil {
		t.Fatal(err)
	}
	var asked string
	old := fetchRegister
	t.Cleanup(func() { fetchRegister = old })
	fetchRegister = func(_ context.Context, e *env) (*nodepb.Register, error) {
		asked = e.config
		return &nodepb.Register{ClusterCaCertificate: ca.Certificate.Raw, RegisterTicket: []byte{0, 1, 2}, CuratorEndpoints: []string{"10.42.0.10:7835"}}, nil
	}
	out := filepath.Join(t.TempDir(), "reg.pb")
	p, _ := params(t, out, "--register", "--config", "/some/config")
	r := p.GetRegister()
	if asked != "/some/config" || !bytes.Equal(r.GetClusterCaCertificate(), ca.Certificate.Raw) ||
		!bytes.Equal(r.GetRegisterTicket(), []byte{0, 1, 2}) || !slices.Equal(r.GetCuratorEndpoints(), []string{"10.42.0.10:7835"}) {
		t.Errorf("asked %q, wrote %v", asked, r)
	}

	// Any of the explicit flags means: do not ask the cluster.
	fetchRegister = func(context.Context, *env) (*nodepb.Register, error) { return nil, errors.New("must not be called") }
	b64 := base64.StdEncoding.EncodeToString([]byte{0xff, 0, 7})
	caFile := filepath.Join(t.TempDir(), "ca.pem")
	if err := writeTestFile(caFile, pki.CertificatePEM(ca.Certificate)); err != nil {
		t.Fatal(err)
	}
	p, _ = params(t, out, "--register", "--ca", caFile, "--ticket-base64", b64, "--curator", "10.0.0.1:7835")
	if got := p.GetRegister().GetRegisterTicket(); !bytes.Equal(got, []byte{0xff, 0, 7}) {
		t.Errorf("ticket %x from --ticket-base64", got)
	}
	for _, tc := range []struct {
		args []string
		code int
		want string
	}{
		{[]string{out, "--register"}, 1, "must not be called"},
		{[]string{out, "--register", "--ticket", "a", "--ticket-base64", "YQ=="}, 2, "not both"},
		{[]string{out, "--bootstrap", "--config", "x"}, 2, "--config only applies with --register"},
		{[]string{out, "--bootstrap", "--endpoint", "127.0.0.1:1"}, 2, "--endpoint only applies with --register"},
	} {
		_, stderr, code := runCLI(append([]string{"params"}, tc.args...)...)
		if code != tc.code || !strings.Contains(stderr, tc.want) {
			t.Errorf("%v: exit %d, %s\nwant exit %d, %q", tc.args, code, stderr, tc.code, tc.want)
		}
	}
}

func writeTestFile(path string, b []byte) error { return paramsWriteFile(path, b, 0o644) }

// params --register writes the CA pinned at takeownership, and refuses (and
// writes nothing) when the cluster reports another one: against an
// in-process Management server, through the owner client.
func TestParamsRegisterPinnedCA(t *testing.T) {
	f := newFakeCluster(t)
	dir := f.owned(t)

	out := filepath.Join(t.TempDir(), "reg.pb")
	p, _ := params(t, out, "--register", "--config", dir)
	if r := p.GetRegister(); !bytes.Equal(r.GetClusterCaCertificate(), f.CA.Certificate.Raw) ||
		string(r.GetRegisterTicket()) != "first ticket" || !slices.Equal(r.GetCuratorEndpoints(), []string{"10.42.0.10:7835"}) {
		t.Errorf("register parameters %v", r)
	}

	// The server now names a CA of its own: nothing is written, not even
	// over the earlier file.
	impostor, err := pki.NewCA("Plinth cluster CA", 0)
	if err != nil {
		t.Fatal(err)
	}
	f.SetInfoCA(impostor)
	before, _ := os.ReadFile(out)
	fresh := filepath.Join(t.TempDir(), "fresh", "reg.pb")
	for _, o := range []string{out, fresh} {
		_, stderr, code := runCLI("params", o, "--register", "--config", dir)
		if code != 1 || !strings.Contains(stderr, owner.ErrCAMismatch.Error()) {
			t.Errorf("%s with a foreign CA: exit %d, %s\nwant ErrCAMismatch", o, code, stderr)
		}
	}
	if after, _ := os.ReadFile(out); !bytes.Equal(after, before) {
		t.Error("the earlier parameters file was replaced")
	}
	if _, err := os.Stat(filepath.Dir(fresh)); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("refused run left %s behind: %v", filepath.Dir(fresh), err)
	}
}
