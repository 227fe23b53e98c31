package main

import (
	"bytes"
	"context"
	"crypto/ed25519"
	"crypto/rand"
	"crypto/x509"
	"encoding/base64"
	"encoding/binary"
	"encoding/pem"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strconv"
	"strings"

	"plinth.dev/plinth/api/nodepb"
	"plinth.dev/plinth/roleserver/parameters"
)

func init() {
	commands["params"] = command{"write a node parameters file (bootstrap or register)", func(_ context.Context, args []string) error {
		return runParams(args, os.Stdout, os.Stderr)
	}}
}

// Files written next to the parameters file when plinthctl makes the owner
// key for a new cluster.
const (
	ownerKeyFile = "owner.key"
	ownerPubFile = "owner.pub"
)

// paramsListFlag collects a flag given several times, or once with commas.
type paramsListFlag []string

func (l *paramsListFlag) String() string { return strings.Join(*l, ",") }

func (l *paramsListFlag) Set(v string) error {
	for s := range strings.SplitSeq(v, ",") {
		if s = strings.TrimSpace(s); s != "" {
			*l = append(*l, s)
		}
	}
	return nil
}

// runParams builds a document from flags, validates it, and only then
// writes anything, so that a mistake never leaves a half-made file (or a
// fresh owner key for a document that was not written) behind.
func runParams(args []string, stdout, stderr io.Writer) error {
	fs := flag.NewFlagSet("params", flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.Usage = func() {
		fmt.Fprint(stderr, `usage: plinthctl params -o FILE (-bootstrap [-owner-key PUB] | -register [-ca CERT.der -ticket T -curator HOST:PORT...]) [flags]

With -register alone, the CA, ticket and curators come from the cluster
(Management, as its owner: see -config).

Writes a node parameters document. Give it to a node as QEMU
-fw_cfg name=`+parameters.FwCfgName+`,file=FILE, as `+parameters.ESPPath+` on the
ESP, or as a kernel argument (-print-cmdline).

`)
		fs.PrintDefaults()
	}
	out := fs.String("o", "", "output `file` (required)")
	bootstrap := fs.Bool("bootstrap", false, "found a new cluster with this node")
	ownerKey := fs.String("owner-key", "", "owner ed25519 public key `file` (PEM, OpenSSH or raw 32 bytes); without it a key pair is made next to -o as "+ownerKeyFile+" and "+ownerPubFile)
	policyTPM := fs.Bool("policy-tpm-required", true, "bootstrap: cluster policy requires every node to use a TPM (set =false for a development cluster)")
	policyStorage := fs.String("policy-storage", "", "bootstrap: minimum storage security of every node, encrypted|authenticated")
	register := fs.Bool("register", false, "register with an existing cluster")
	caFile := fs.String("ca", "", "register: cluster CA certificate `file` (DER or PEM)")
	ticket := fs.String("ticket", "", "register: registration ticket")
	ticketB64 := fs.String("ticket-base64", "", "register: registration ticket in base64 (as plinthctl ticket prints it)")
	configDir := configFlag(fs)
	var curators paramsListFlag
	fs.Var(&curators, "curator", "register: curator `host:port` (repeat or comma-separate)")
	tpm := fs.String("tpm", "", "required|disabled (disabled is for development only; default required)")
	storage := fs.String("storage", "", "data partition security, encrypted|authenticated (default encrypted)")
	fsType := fs.String("fs", "", "data partition filesystem, ext4|xfs (default ext4)")
	sealPCRs := fs.String("seal-pcrs", "", "comma-separated PCRs to seal the node key to (default 4,7,11,15)")
	staticAddr := fs.String("static-address", "", "static address in `CIDR` form (default DHCPv4)")
	iface := fs.String("interface", "", "interface for -static-address (default the first ethernet link)")
	gateway := fs.String("gateway", "", "default gateway `IP` for -static-address")
	var dns paramsListFlag
	fs.Var(&dns, "dns", "DNS resolver `IP`s for -static-address (repeat or comma-separate)")
	hostname := fs.String("hostname", "", "node hostname (default derived from the MAC address)")
	printCmdline := fs.Bool("print-cmdline", false, "also print the "+parameters.CmdlineKey+"= kernel argument")
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return nil
		}
		return err
	}
	set := map[string]bool{}
	fs.Visit(func(f *flag.Flag) { set[f.Name] = true })

	switch {
	case fs.NArg() > 0:
		return fmt.Errorf("unexpected arguments %q", fs.Args())
	case *out == "":
		return errors.New("-o FILE is required")
	case *bootstrap == *register:
		return errors.New("give exactly one of -bootstrap and -register")
	}
	only := func(mode string, names ...string) error {
		for _, n := range names {
			if set[n] {
				return fmt.Errorf("-%s only applies with %s", n, mode)
			}
		}
		return nil
	}
	if err := only("-bootstrap", "owner-key", "policy-tpm-required", "policy-storage"); *register && err != nil {
		return err
	}
	if err := only("-register", "ca", "ticket", "ticket-base64", "curator", "config"); *bootstrap && err != nil {
		return err
	}
	if err := only("-static-address", "interface", "gateway", "dns"); *staticAddr == "" && err != nil {
		return err
	}
	if *bootstrap && *tpm == "disabled" && *policyTPM {
		// Validate would reject it too; this says which flag to change.
		return errors.New("-tpm disabled founds a cluster whose policy requires a TPM; add -policy-tpm-required=false to make a development cluster explicitly")
	}

	p := &nodepb.Parameters{}
	var newKey ed25519.PrivateKey
	if *bootstrap {
		b := &nodepb.Bootstrap{InitialPolicy: &nodepb.ClusterPolicy{AllowNodesWithoutTpm: !*policyTPM}}
		var err error
		if b.InitialPolicy.StorageSecurity, err = parseStorage(*policyStorage); err != nil {
			return fmt.Errorf("-policy-storage: %w", err)
		}
		if *ownerKey != "" {
			if b.OwnerPublicKey, err = readOwnerKey(*ownerKey); err != nil {
				return fmt.Errorf("-owner-key: %w", err)
			}
		} else {
			// Refuse before generating: overwriting an owner key would lock
			// its holder out of a cluster that may already exist.
			if _, err := os.Lstat(filepath.Join(filepath.Dir(*out), ownerKeyFile)); err == nil {
				return fmt.Errorf("%s already exists next to %s; pass -owner-key %s to reuse it, or move it away",
					ownerKeyFile, *out, filepath.Join(filepath.Dir(*out), ownerPubFile))
			}
			pub, priv, err := ed25519.GenerateKey(rand.Reader)
			if err != nil {
				return err
			}
			b.OwnerPublicKey, newKey = pub, priv
		}
		p.Cluster = &nodepb.Parameters_Bootstrap{Bootstrap: b}
	} else {
		r := &nodepb.Register{RegisterTicket: []byte(*ticket), CuratorEndpoints: curators}
		if set["ticket"] && set["ticket-base64"] {
			return errors.New("give -ticket or -ticket-base64, not both")
		}
		if *ticketB64 != "" {
			var err error
			if r.RegisterTicket, err = base64.StdEncoding.DecodeString(*ticketB64); err != nil {
				return fmt.Errorf("-ticket-base64: %w", err)
			}
		}
		if *caFile != "" {
			var err error
			if r.ClusterCaCertificate, err = readCert(*caFile); err != nil {
				return fmt.Errorf("-ca: %w", err)
			}
		}
		if !set["ca"] && !set["ticket"] && !set["ticket-base64"] && !set["curator"] {
			var err error
			if r, err = fetchRegister(*configDir); err != nil {
				return fmt.Errorf("fetching the register parameters from the cluster (or give -ca, -ticket and -curator): %w", err)
			}
		}
		p.Cluster = &nodepb.Parameters_Register{Register: r}
	}

	if *storage != "" || *fsType != "" {
		s, err := parseStorage(*storage)
		if err != nil {
			return fmt.Errorf("-storage: %w", err)
		}
		f, err := parseFS(*fsType)
		if err != nil {
			return fmt.Errorf("-fs: %w", err)
		}
		p.Storage = &nodepb.NodeStorage{Security: s, Filesystem: f}
	}
	if *tpm != "" || *sealPCRs != "" {
		t := &nodepb.NodeTPM{}
		switch *tpm {
		case "":
		case "required":
			t.Policy = nodepb.NodeTPM_TPM_POLICY_REQUIRED
		case "disabled":
			t.Policy = nodepb.NodeTPM_TPM_POLICY_DISABLED_FOR_DEVELOPMENT
		default:
			return fmt.Errorf("-tpm %q: want required or disabled", *tpm)
		}
		for s := range strings.SplitSeq(*sealPCRs, ",") {
			if s = strings.TrimSpace(s); s == "" {
				continue
			}
			n, err := strconv.ParseUint(s, 10, 32)
			if err != nil {
				return fmt.Errorf("-seal-pcrs: %q is not a PCR number", s)
			}
			t.SealPcrs = append(t.SealPcrs, uint32(n))
		}
		p.Tpm = t
	}
	if *staticAddr != "" || *hostname != "" {
		p.Network = &nodepb.Network{Hostname: *hostname}
		if *staticAddr != "" {
			p.Network.Static = &nodepb.StaticConfig{Interface: *iface, Address: *staticAddr, Gateway: *gateway, Dns: dns}
		}
	}

	raw, err := parameters.Encode(p) // validates
	if err != nil {
		return fmt.Errorf("invalid parameters:\n%w", err)
	}
	if newKey != nil {
		if err := writeOwnerKey(filepath.Dir(*out), newKey); err != nil {
			return err
		}
		fmt.Fprintf(stderr, "plinthctl: made a new cluster owner key %s (keep it safe: it is the only way to administer the cluster) and %s\n",
			filepath.Join(filepath.Dir(*out), ownerKeyFile), filepath.Join(filepath.Dir(*out), ownerPubFile))
	}
	// The document may hold a registration ticket, which lets anyone holding
	// it ask to join the cluster, so only the owner may read it.
	if err := paramsWriteFile(*out, raw, 0o600); err != nil {
		return err
	}
	if *printCmdline {
		arg := parameters.CmdlineKey + "=" + parameters.CmdlineValue(raw)
		// x86 Linux truncates the whole command line at 2048 bytes
		// (COMMAND_LINE_SIZE), and the image's own arguments need room too.
		if len(arg) > 1024 {
			fmt.Fprintf(stderr, "plinthctl: warning: the kernel argument is %d bytes; with the image's own arguments it may exceed the kernel's 2048-byte limit. Prefer fw_cfg or the ESP file.\n", len(arg))
		}
		fmt.Fprintln(stdout, arg)
	}
	return nil
}

// fetchRegister asks the cluster for a new node's register parameters
// with the owner configuration in dir. A variable so tests can stand in.
var fetchRegister = func(dir string) (*nodepb.Register, error) {
	c, err := dialOwner(dir)
	if err != nil {
		return nil, err
	}
	defer c.Close()
	ctx, cancel := context.WithTimeout(context.Background(), callTimeout)
	defer cancel()
	return c.RegisterParameters(ctx)
}

func parseStorage(s string) (nodepb.StorageSecurity, error) {
	switch s {
	case "":
		return nodepb.StorageSecurity_STORAGE_SECURITY_UNSPECIFIED, nil
	case "encrypted":
		return nodepb.StorageSecurity_STORAGE_SECURITY_ENCRYPTED, nil
	case "authenticated":
		return nodepb.StorageSecurity_STORAGE_SECURITY_AUTHENTICATED, nil
	}
	return 0, fmt.Errorf("%q: want encrypted or authenticated", s)
}

func parseFS(s string) (nodepb.NodeStorage_Filesystem, error) {
	switch s {
	case "":
		return nodepb.NodeStorage_FILESYSTEM_UNSPECIFIED, nil
	case "ext4":
		return nodepb.NodeStorage_FILESYSTEM_EXT4, nil
	case "xfs":
		return nodepb.NodeStorage_FILESYSTEM_XFS, nil
	}
	return 0, fmt.Errorf("%q: want ext4 or xfs", s)
}

// readOwnerKey accepts the forms an operator is likely to have: the
// owner.pub this command writes (PKIX PEM), an OpenSSH ed25519 public key,
// or the raw 32 bytes.
func readOwnerKey(path string) ([]byte, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	if blk, _ := pem.Decode(b); blk != nil {
		if blk.Type != "PUBLIC KEY" {
			return nil, fmt.Errorf("%s: PEM block %q, want PUBLIC KEY (the private key stays with the owner)", path, blk.Type)
		}
		k, err := x509.ParsePKIXPublicKey(blk.Bytes)
		if err != nil {
			return nil, fmt.Errorf("%s: %w", path, err)
		}
		pub, ok := k.(ed25519.PublicKey)
		if !ok {
			return nil, fmt.Errorf("%s: a %T, want ed25519", path, k)
		}
		return pub, nil
	}
	if f := strings.Fields(string(b)); len(f) >= 2 && f[0] == "ssh-ed25519" {
		return parseSSHEd25519(f[1])
	}
	if len(b) == ed25519.PublicKeySize {
		return b, nil
	}
	return nil, fmt.Errorf("%s: not a PEM, OpenSSH or raw 32-byte ed25519 public key", path)
}

// parseSSHEd25519 decodes the base64 part of an OpenSSH public key line:
// string "ssh-ed25519", then string key (RFC 4253 and RFC 8709 encoding).
func parseSSHEd25519(b64 string) ([]byte, error) {
	blob, err := base64.StdEncoding.DecodeString(b64)
	if err != nil {
		return nil, fmt.Errorf("OpenSSH key: %w", err)
	}
	var parts [][]byte
	for len(blob) >= 4 && len(parts) < 2 {
		n := binary.BigEndian.Uint32(blob)
		if uint64(n) > uint64(len(blob)-4) {
			break
		}
		parts, blob = append(parts, blob[4:4+n]), blob[4+n:]
	}
	if len(parts) != 2 || string(parts[0]) != "ssh-ed25519" || len(parts[1]) != ed25519.PublicKeySize || len(blob) != 0 {
		return nil, errors.New("malformed OpenSSH ed25519 public key")
	}
	return parts[1], nil
}

// readCert takes DER, or PEM for convenience since that is how most tools
// hand out certificates; the document always carries DER.
func readCert(path string) ([]byte, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	if blk, _ := pem.Decode(b); blk != nil {
		if blk.Type != "CERTIFICATE" {
			return nil, fmt.Errorf("%s: PEM block %q, want CERTIFICATE", path, blk.Type)
		}
		return blk.Bytes, nil
	}
	return b, nil
}

// writeOwnerKey writes the private key (PKCS#8 PEM, 0600, never replacing
// an existing file) and the public key (PKIX PEM) into dir.
func writeOwnerKey(dir string, priv ed25519.PrivateKey) error {
	der, err := x509.MarshalPKCS8PrivateKey(priv)
	if err != nil {
		return err
	}
	pubDER, err := x509.MarshalPKIXPublicKey(priv.Public())
	if err != nil {
		return err
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return err
	}
	keyPath := filepath.Join(dir, ownerKeyFile)
	f, err := os.OpenFile(keyPath, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o600)
	if err != nil {
		return err
	}
	if err := pem.Encode(f, &pem.Block{Type: "PRIVATE KEY", Bytes: der}); err != nil {
		f.Close()
		return err
	}
	if err := f.Close(); err != nil {
		return err
	}
	return paramsWriteFile(filepath.Join(dir, ownerPubFile), pem.EncodeToMemory(&pem.Block{Type: "PUBLIC KEY", Bytes: pubDER}), 0o644)
}

// paramsWriteFile replaces path in one step, so that a node (or QEMU) never
// reads a half-written document.
func paramsWriteFile(path string, data []byte, mode os.FileMode) error {
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		return err
	}
	f, err := os.CreateTemp(filepath.Dir(path), "."+filepath.Base(path)+".*")
	if err != nil {
		return err
	}
	defer os.Remove(f.Name())
	if _, err := io.Copy(f, bytes.NewReader(data)); err != nil {
		f.Close()
		return err
	}
	if err := f.Chmod(mode); err != nil {
		f.Close()
		return err
	}
	if err := f.Close(); err != nil {
		return err
	}
	return os.Rename(f.Name(), path)
}
