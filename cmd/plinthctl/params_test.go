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
	"io"
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

// runParams runs plinthctl params with these arguments.
func runParams(args []string, stdout, stderr io.Writer) error {
	return new(paramsCmd).run(context.Background(), args, stdout, stderr)
}

// params runs the command as main would and decodes what it wrote.
func params(t *testing.T, args ...string) (*nodepb.Parameters, string) {
	t.Helper()
	var stdout, stderr bytes.Buffer
	if err := runParams(args, &stdout, &stderr); err != nil {
		t.Fatalf("plinthctl params %s: %v\nstderr: %s", strings.Join(args, " "), err, stderr.String())
	}
	out := args[slices.Index(args, "-o")+1]
	raw, err := os.ReadFile(out)
	if err != nil {
		t.Fatal(err)
	}
	p, err := parameters.Decode(raw)
	if err != nil {
		t.Fatalf("written document does not decode: %v", err)
	}
	return p, stdout.String()
}

func TestParamsBootstrapNewKey(t *testing.T) {
	dir := t.TempDir()
	out := filepath.Join(dir, "node", "params.pb")
	p, stdout := params(t, "-o", out, "-bootstrap", "-storage", "authenticated", "-fs", "xfs",
		"-seal-pcrs", "7,11,15", "-hostname", "node-a", "-static-address", "10.0.2.15/24",
		"-gateway", "10.0.2.2", "-dns", "10.0.2.3,10.0.2.4", "-print-cmdline")

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

	// -print-cmdline prints the kernel argument for the same bytes.
	raw, _ := os.ReadFile(out)
	if want := parameters.CmdlineKey + "=" + parameters.CmdlineValue(raw) + "\n"; stdout != want {
		t.Errorf("stdout %q, want %q", stdout, want)
	}

	// owner.pub feeds a second node's document, and an existing owner.key
	// is never replaced.
	pub := filepath.Join(dir, "node", ownerPubFile)
	p2, _ := params(t, "-o", filepath.Join(dir, "node", "again.pb"), "-bootstrap", "-owner-key", pub)
	if !bytes.Equal(p2.GetBootstrap().GetOwnerPublicKey(), b.GetOwnerPublicKey()) {
		t.Error("-owner-key owner.pub gave a different key")
	}
	err = runParams([]string{"-o", filepath.Join(dir, "node", "third.pb"), "-bootstrap"}, &bytes.Buffer{}, &bytes.Buffer{})
	if err == nil || !strings.Contains(err.Error(), "already exists") {
		t.Errorf("second key generation in the same directory: %v", err)
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
		p, _ := params(t, "-o", filepath.Join(dir, name+".pb"), "-bootstrap", "-owner-key", f, "-tpm", "disabled", "-policy-tpm-required=false")
		if !bytes.Equal(p.GetBootstrap().GetOwnerPublicKey(), pub) {
			t.Errorf("%s: wrong key", name)
		}
		if p.GetTpm().GetPolicy() != nodepb.NodeTPM_TPM_POLICY_DISABLED_FOR_DEVELOPMENT || !p.GetBootstrap().GetInitialPolicy().GetAllowNodesWithoutTpm() {
			t.Errorf("%s: TPM settings %v", name, p)
		}
	}
	if _, err := os.Stat(filepath.Join(dir, ownerKeyFile)); err == nil {
		t.Error("a key pair was generated although -owner-key was given")
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
		p, _ := params(t, "-o", out, "-register", "-ca", ca, "-ticket", "tkt",
			"-curator", "10.0.0.1:7835", "-curator", "10.0.0.2:7835,10.0.0.3:7835", "-tpm", "required")
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

// Bad flags and invalid documents fail before anything is written.
func TestParamsErrors(t *testing.T) {
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"-bootstrap"}, "-o FILE is required"},
		{[]string{"-o", "F"}, "exactly one of -bootstrap and -register"},
		{[]string{"-o", "F", "-bootstrap", "-register"}, "exactly one of -bootstrap and -register"},
		{[]string{"-o", "F", "-bootstrap", "-ticket", "x"}, "-ticket only applies with -register"},
		{[]string{"-o", "F", "-register", "-owner-key", "x"}, "-owner-key only applies with -bootstrap"},
		{[]string{"-o", "F", "-bootstrap", "-gateway", "10.0.0.1"}, "-gateway only applies with -static-address"},
		{[]string{"-o", "F", "-register", "-ticket", "t", "-curator", "a:1"}, "register.cluster_ca_certificate: missing"},
		{[]string{"-o", "F", "-bootstrap", "-tpm", "off"}, `-tpm "off"`},
		{[]string{"-o", "F", "-bootstrap", "-tpm", "disabled"}, "add -policy-tpm-required=false"},
		{[]string{"-o", "F", "-bootstrap", "-storage", "plain"}, `-storage: "plain"`},
		{[]string{"-o", "F", "-bootstrap", "-fs", "btrfs"}, `-fs: "btrfs"`},
		{[]string{"-o", "F", "-bootstrap", "-seal-pcrs", "7,x"}, `"x" is not a PCR number`},
		{[]string{"-o", "F", "-bootstrap", "-seal-pcrs", "7,30"}, "PCR 30 does not exist"},
		{[]string{"-o", "F", "-bootstrap", "-static-address", "10.0.0.5"}, "not CIDR"},
		{[]string{"-o", "F", "-bootstrap", "stray"}, "unexpected arguments"},
	} {
		dir := t.TempDir()
		args := slices.Clone(tc.args)
		for i, a := range args {
			if a == "F" {
				args[i] = filepath.Join(dir, "params.pb")
			}
		}
		err := runParams(args, &bytes.Buffer{}, &bytes.Buffer{})
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%v: error %v, want %q", tc.args, err, tc.want)
		}
		if ents, _ := os.ReadDir(dir); len(ents) != 0 {
			t.Errorf("%v: left files behind: %v", tc.args, ents)
		}
	}
}

// The command is registered under its name, as main dispatches it.
func TestParamsRegistered(t *testing.T) {
	c, ok := commands["params"]
	if !ok || c.summary == "" {
		t.Fatal("params is not registered")
	}
	out := filepath.Join(t.TempDir(), "p.pb")
	if err := c.new().run(context.Background(), []string{"-o", out, "-bootstrap"}, io.Discard, io.Discard); err != nil {
		t.Fatal(err)
	}
	raw, _ := os.ReadFile(out)
	if _, err := parameters.Decode(raw); err != nil {
		t.Error(err)
	}
}

// params -register without -ca/-ticket/-curator takes them from the
// cluster, with the configuration dir given.
func TestParamsRegisterFromCluster(t *testing.T) {
	ca, err := pki.NewCA("cluster", 0)
	if err != nil {
		t.Fatal(err)
	}
	var asked string
	old := fetchRegister
	t.Cleanup(func() { fetchRegister = old })
	fetchRegister = func(_ context.Context, dir string) (*nodepb.Register, error) {
		asked = dir
		return &nodepb.Register{ClusterCaCertificate: ca.Certificate.Raw, RegisterTicket: []byte{0, 1, 2}, CuratorEndpoints: []string{"10.42.0.10:7835"}}, nil
	}
	out := filepath.Join(t.TempDir(), "reg.pb")
	p, _ := params(t, "-o", out, "-register", "-config", "/some/config")
	r := p.GetRegister()
	if asked != "/some/config" || !bytes.Equal(r.GetClusterCaCertificate(), ca.Certificate.Raw) ||
		!bytes.Equal(r.GetRegisterTicket(), []byte{0, 1, 2}) || !slices.Equal(r.GetCuratorEndpoints(), []string{"10.42.0.10:7835"}) {
		t.Errorf("asked %q, wrote %v", asked, r)
	}

	// Any of the explicit flags means: do not ask the cluster.
	fetchRegister = func(context.Context, string) (*nodepb.Register, error) { return nil, errors.New("must not be called") }
	b64 := base64.StdEncoding.EncodeToString([]byte{0xff, 0, 7})
	caFile := filepath.Join(t.TempDir(), "ca.pem")
	if err := writeTestFile(caFile, pki.CertificatePEM(ca.Certificate)); err != nil {
		t.Fatal(err)
	}
	p, _ = params(t, "-o", out, "-register", "-ca", caFile, "-ticket-base64", b64, "-curator", "10.0.0.1:7835")
	if got := p.GetRegister().GetRegisterTicket(); !bytes.Equal(got, []byte{0xff, 0, 7}) {
		t.Errorf("ticket %x from -ticket-base64", got)
	}
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"-o", out, "-register"}, "must not be called"},
		{[]string{"-o", out, "-register", "-ticket", "a", "-ticket-base64", "YQ=="}, "not both"},
		{[]string{"-o", out, "-bootstrap", "-config", "x"}, "-config only applies with -register"},
	} {
		err := runParams(tc.args, &bytes.Buffer{}, &bytes.Buffer{})
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%v: %v, want %q", tc.args, err, tc.want)
		}
	}
}

func writeTestFile(path string, b []byte) error { return paramsWriteFile(path, b, 0o644) }

// params -register writes the CA pinned at takeownership, and refuses (and
// writes nothing) when the cluster reports another one: against an
// in-process Management server, through the owner client.
func TestParamsRegisterPinnedCA(t *testing.T) {
	f := newFakeCluster(t)
	dir := f.owned(t)

	out := filepath.Join(t.TempDir(), "reg.pb")
	p, _ := params(t, "-o", out, "-register", "-config", dir)
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
		err := runParams([]string{"-o", o, "-register", "-config", dir}, &bytes.Buffer{}, &bytes.Buffer{})
		if !errors.Is(err, owner.ErrCAMismatch) {
			t.Errorf("-o %s with a foreign CA reported: %v, want ErrCAMismatch", o, err)
		}
	}
	if after, _ := os.ReadFile(out); !bytes.Equal(after, before) {
		t.Error("the earlier parameters file was replaced")
	}
	if _, err := os.Stat(filepath.Dir(fresh)); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("refused run left %s behind: %v", filepath.Dir(fresh), err)
	}
}
