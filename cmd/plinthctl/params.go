package main

import (
	"context"
	"crypto/ed25519"
	"crypto/rand"
	"encoding/base64"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strconv"
	"strings"

	"github.com/spf13/pflag"

	"plinth.dev/plinth/api/nodepb"
	"plinth.dev/plinth/roleserver/owner"
	"plinth.dev/plinth/roleserver/parameters"
)

func init() {
	add(spec{path: "params", args: "[FILE]", short: "Write a node parameters file (bootstrap or register)", group: groupImage,
		long: "Write a node parameters document to FILE (or --file FILE): --bootstrap founds a new\n" +
			"cluster with the node, --register joins an existing one. Give it to a node as QEMU\n" +
			"-fw_cfg name=" + parameters.FwCfgName + ",file=FILE, as " + parameters.ESPPath + " on the ESP, or as a\n" +
			"kernel argument (--print-cmdline).\n\n" +
			"With --register alone, the CA, ticket and curators come from the cluster (Management,\n" +
			"as its owner: see --config and --endpoint); the CA is the one pinned in the owner\n" +
			"configuration at plinthctl cluster takeownership.",
		minArgs: 0, maxArgs: 1, new: func() command { return new(paramsCmd) }})
}

// Files written next to the parameters file when plinthctl makes the owner
// key for a new cluster.
const (
	ownerKeyFile = "owner.key"
	ownerPubFile = "owner.pub"
)

// paramsCmd is `plinthctl params FILE`: it builds a document from flags,
// validates it, and only then writes anything, so that a mistake never
// leaves a half-made file (or a fresh owner key for a document that was
// not written) behind.
//
// With --register alone, the CA, ticket and curators come from the
// cluster as its owner; the CA written is the one pinned in the owner
// configuration at takeownership, and a cluster that reports another one
// is refused (owner.ErrCAMismatch).
type paramsCmd struct {
	fs            *pflag.FlagSet // which flags were given (some apply only with others)
	out           string
	bootstrap     bool
	ownerKey      string
	policyTPM     bool
	policyStorage string
	register      bool
	caFile        string
	ticket        string
	ticketB64     string
	curators      listFlag
	tpm           string
	storage       string
	fsType        string
	sealPCRs      string
	unmeasured    bool
	staticAddr    string
	iface         string
	gateway       string
	dns           listFlag
	hostname      string
	printCmdline  bool
}

func (c *paramsCmd) run(ctx context.Context, e *env, args []string) error {
	if err := c.check(args); err != nil {
		return err
	}

	// The sections of the document, in its order; nothing is written
	// before all of them are made and the whole validates.
	p := &nodepb.Parameters{}
	var newKey ed25519.PrivateKey
	if c.bootstrap {
		b, key, err := c.bootstrapSection()
		if err != nil {
			return err
		}
		p.Cluster, newKey = &nodepb.Parameters_Bootstrap{Bootstrap: b}, key
	} else {
		r, err := c.registerSection(ctx, e)
		if err != nil {
			return err
		}
		p.Cluster = &nodepb.Parameters_Register{Register: r}
	}
	var err error
	if p.Storage, err = c.storageSection(); err != nil {
		return err
	}
	if p.Tpm, err = c.tpmSection(); err != nil {
		return err
	}
	p.Network = c.networkSection()

	raw, err := parameters.Encode(p) // validates
	if err != nil {
		return fmt.Errorf("invalid parameters:\n%w", err)
	}
	return c.write(raw, newKey, e.stdout, e.stderr)
}

func (c *paramsCmd) flags(fs *pflag.FlagSet) {
	c.fs = fs
	fs.StringVar(&c.out, "file", "", "output `file`, instead of the FILE argument")
	fs.BoolVar(&c.bootstrap, "bootstrap", false, "found a new cluster with this node")
	fs.StringVar(&c.ownerKey, "owner-key", "", "owner ed25519 public key `file` (PEM, OpenSSH or raw 32 bytes); without it a key pair is made next to FILE as "+ownerKeyFile+" and "+ownerPubFile)
	fs.BoolVar(&c.policyTPM, "policy-tpm-required", true, "bootstrap: cluster policy requires every node to use a TPM (--policy-tpm-required=false for a development cluster)")
	fs.StringVar(&c.policyStorage, "policy-storage", "", "bootstrap: minimum storage security of every node, `encrypted|authenticated`")
	fs.BoolVar(&c.register, "register", false, "register with an existing cluster")
	fs.StringVar(&c.caFile, "ca", "", "register: cluster CA certificate `file` (DER or PEM)")
	fs.StringVar(&c.ticket, "ticket", "", "register: registration `ticket`")
	fs.StringVar(&c.ticketB64, "ticket-base64", "", "register: registration ticket in `base64` (as plinthctl cluster ticket prints it)")
	fs.Var(&c.curators, "curator", "register: curator `host:port` (repeat or comma-separate)")
	fs.StringVar(&c.tpm, "tpm", "", "the node's TPM policy, `required|disabled` (disabled is for development only; default required)")
	fs.StringVar(&c.storage, "storage", "", "data partition security, `encrypted|authenticated` (default encrypted)")
	fs.StringVar(&c.fsType, "fs", "", "data partition filesystem, `ext4|xfs` (default ext4)")
	fs.StringVar(&c.sealPCRs, "seal-pcrs", "", "comma-separated `PCRs` to seal the node key to (default 4,7,11,12,15)")
	fs.BoolVar(&c.unmeasured, "allow-unmeasured-boot", false, "let the node seal a new key on a boot firmware did not measure (QEMU -kernel; development only)")
	fs.StringVar(&c.staticAddr, "static-address", "", "static address in `CIDR` form (default DHCPv4)")
	fs.StringVar(&c.iface, "interface", "", "interface `name` for --static-address (default the first ethernet link)")
	fs.StringVar(&c.gateway, "gateway", "", "default gateway `IP` for --static-address")
	fs.Var(&c.dns, "dns", "DNS resolver `IP`s for --static-address (repeat or comma-separate)")
	fs.StringVar(&c.hostname, "hostname", "", "node host `name` (default derived from the MAC address)")
	fs.BoolVar(&c.printCmdline, "print-cmdline", false, "also print the "+parameters.CmdlineKey+"= kernel argument")
}

// check refuses combinations of flags that make no document, or not the
// one asked for, before anything is read or made; args are the
// positional arguments (FILE, if given so).
func (c *paramsCmd) check(args []string) error {
	switch {
	case len(args) == 1 && c.out != "":
		return usagef("give the output file as FILE or as --file FILE, not both")
	case len(args) == 1:
		c.out = args[0]
	case c.out == "":
		return usagef("the output file is required: plinthctl params FILE (or --file FILE)")
	}
	if c.bootstrap == c.register {
		return usagef("give exactly one of --bootstrap and --register")
	}
	only := func(mode string, names ...string) error {
		for _, n := range names {
			if c.fs.Changed(n) {
				return usagef("--%s only applies with %s", n, mode)
			}
		}
		return nil
	}
	if err := only("--bootstrap", "owner-key", "policy-tpm-required", "policy-storage"); c.register && err != nil {
		return err
	}
	if err := only("--register", "ca", "ticket", "ticket-base64", "curator", "config", "endpoint"); c.bootstrap && err != nil {
		return err
	}
	if err := only("--static-address", "interface", "gateway", "dns"); c.staticAddr == "" && err != nil {
		return err
	}
	if c.bootstrap && c.tpm == "disabled" && c.policyTPM {
		// Validate would reject it too; this says which flag to change.
		return usagef("--tpm disabled founds a cluster whose policy requires a TPM; add --policy-tpm-required=false to make a development cluster explicitly")
	}
	if c.register && c.fs.Changed("ticket") && c.fs.Changed("ticket-base64") {
		return usagef("give --ticket or --ticket-base64, not both")
	}
	return nil
}

// bootstrapSection is the document's Bootstrap: the initial cluster
// policy and the owner's public key, read from --owner-key or of a key
// pair made here (returned, to be written with the document).
func (c *paramsCmd) bootstrapSection() (*nodepb.Bootstrap, ed25519.PrivateKey, error) {
	b := &nodepb.Bootstrap{InitialPolicy: &nodepb.ClusterPolicy{AllowNodesWithoutTpm: !c.policyTPM}}
	var err error
	if b.InitialPolicy.StorageSecurity, err = parseStorage(c.policyStorage); err != nil {
		return nil, nil, usagef("--policy-storage: %v", err)
	}
	if c.ownerKey != "" {
		if b.OwnerPublicKey, err = readOwnerKey(c.ownerKey); err != nil {
			return nil, nil, fmt.Errorf("--owner-key: %w", err)
		}
		return b, nil, nil
	}
	// Refuse before generating: overwriting an owner key would lock its
	// holder out of a cluster that may already exist.
	if _, err := os.Lstat(filepath.Join(filepath.Dir(c.out), ownerKeyFile)); err == nil {
		return nil, nil, fmt.Errorf("%s already exists next to %s; pass --owner-key %s to reuse it, or move it away",
			ownerKeyFile, c.out, filepath.Join(filepath.Dir(c.out), ownerPubFile))
	}
	pub, priv, err := ed25519.GenerateKey(rand.Reader)
	if err != nil {
		return nil, nil, err
	}
	b.OwnerPublicKey = pub
	return b, priv, nil
}

// registerSection is the document's Register: the CA, ticket and
// curators from the flags or, when none of them is given, from the
// cluster as its owner.
func (c *paramsCmd) registerSection(ctx context.Context, e *env) (*nodepb.Register, error) {
	r := &nodepb.Register{RegisterTicket: []byte(c.ticket), CuratorEndpoints: c.curators}
	var err error
	if c.ticketB64 != "" {
		if r.RegisterTicket, err = base64.StdEncoding.DecodeString(c.ticketB64); err != nil {
			return nil, usagef("--ticket-base64: %v", err)
		}
	}
	if c.caFile != "" {
		if r.ClusterCaCertificate, err = readCert(c.caFile); err != nil {
			return nil, fmt.Errorf("--ca: %w", err)
		}
	}
	if c.fs.Changed("ca") || c.fs.Changed("ticket") || c.fs.Changed("ticket-base64") || c.fs.Changed("curator") {
		return r, nil
	}
	r, err = fetchRegister(ctx, e)
	if errors.Is(err, owner.ErrCAMismatch) {
		// Nodes must trust the CA the owner pinned: a curator that names
		// another one is not to be believed, nor worked around.
		return nil, fmt.Errorf("refusing to write register parameters: %w (the pinned CA is %s)", err, filepath.Join(e.config, owner.CAFile))
	}
	if err != nil {
		return nil, fmt.Errorf("fetching the register parameters from the cluster (or give --ca, --ticket and --curator): %w", err)
	}
	return r, nil
}

// storageSection is the document's NodeStorage (nil: the node's
// defaults).
func (c *paramsCmd) storageSection() (*nodepb.NodeStorage, error) {
	if c.storage == "" && c.fsType == "" {
		return nil, nil
	}
	s, err := parseStorage(c.storage)
	if err != nil {
		return nil, usagef("--storage: %v", err)
	}
	f, err := parseFS(c.fsType)
	if err != nil {
		return nil, usagef("--fs: %v", err)
	}
	return &nodepb.NodeStorage{Security: s, Filesystem: f}, nil
}

// tpmSection is the document's NodeTPM (nil: the node's defaults).
func (c *paramsCmd) tpmSection() (*nodepb.NodeTPM, error) {
	if c.tpm == "" && c.sealPCRs == "" && !c.unmeasured {
		return nil, nil
	}
	t := &nodepb.NodeTPM{AllowUnmeasuredBoot: c.unmeasured}
	switch c.tpm {
	case "":
	case "required":
		t.Policy = nodepb.NodeTPM_TPM_POLICY_REQUIRED
	case "disabled":
		t.Policy = nodepb.NodeTPM_TPM_POLICY_DISABLED_FOR_DEVELOPMENT
	default:
		return nil, usagef("--tpm %q: want required or disabled", c.tpm)
	}
	for s := range strings.SplitSeq(c.sealPCRs, ",") {
		if s = strings.TrimSpace(s); s == "" {
			continue
		}
		n, err := strconv.ParseUint(s, 10, 32)
		if err != nil {
			return nil, usagef("--seal-pcrs: %q is not a PCR number", s)
		}
		t.SealPcrs = append(t.SealPcrs, uint32(n))
	}
	return t, nil
}

// networkSection is the document's Network (nil: DHCPv4 and a hostname
// derived from the MAC address).
func (c *paramsCmd) networkSection() *nodepb.Network {
	if c.staticAddr == "" && c.hostname == "" {
		return nil
	}
	n := &nodepb.Network{Hostname: c.hostname}
	if c.staticAddr != "" {
		n.Static = &nodepb.StaticConfig{Interface: c.iface, Address: c.staticAddr, Gateway: c.gateway, Dns: c.dns}
	}
	return n
}

// write writes the new owner key pair, if one was made, then the
// encoded document raw, and prints the kernel argument if asked.
func (c *paramsCmd) write(raw []byte, newKey ed25519.PrivateKey, stdout, stderr io.Writer) error {
	if newKey != nil {
		if err := writeOwnerKey(filepath.Dir(c.out), newKey); err != nil {
			return err
		}
		fmt.Fprintf(stderr, "plinthctl: made a new cluster owner key %s (keep it safe: it is the only way to administer the cluster) and %s\n",
			filepath.Join(filepath.Dir(c.out), ownerKeyFile), filepath.Join(filepath.Dir(c.out), ownerPubFile))
	}
	// The document may hold a registration ticket, which lets anyone holding
	// it ask to join the cluster, so only the owner may read it.
	if err := paramsWriteFile(c.out, raw, 0o600); err != nil {
		return err
	}
	if c.printCmdline {
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
// as its owner (--config, --endpoint): the CA is the pinned one, and a
// cluster reporting another is owner.ErrCAMismatch. A variable so tests
// can stand in.
var fetchRegister = func(ctx context.Context, e *env) (*nodepb.Register, error) {
	c, err := e.dial()
	if err != nil {
		return nil, err
	}
	defer c.Close()
	ctx, cancel := context.WithTimeout(ctx, callTimeout)
	defer cancel()
	return c.RegisterParameters(ctx)
}
