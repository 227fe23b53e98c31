package main

import (
	"context"
	"crypto/ed25519"
	"encoding/base64"
	"encoding/hex"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"net"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"

	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/proto"

	"plinth.dev/plinth/api/clusterpb"
	"plinth.dev/plinth/platform/layout"
	"plinth.dev/plinth/roleserver/identity"
	"plinth.dev/plinth/roleserver/owner"
)

// Cluster commands: the owner's side of the cluster API, with the
// configuration directory of roleserver/owner (-config, default
// $PLINTH_CONFIG, else $XDG_CONFIG_HOME/plinth or ~/.config/plinth).

func init() {
	commands["takeownership"] = command{"take ownership of a freshly bootstrapped cluster", runTakeOwnership}
	commands["nodes"] = command{"list or describe the cluster's nodes (nodes list | nodes describe NODE)", runNodes}
	commands["approve"] = command{"approve NEW nodes (without arguments: list them)", runApprove}
	commands["roles"] = command{"roles add|remove NODE consensus-member|kubernetes-controller|kubernetes-worker...", runRoles}
	commands["ticket"] = command{"print the cluster's register ticket (base64)", runTicket}
	commands["logs"] = command{"print a node's logs (-f to follow)", runLogs}
	commands["reboot"] = command{"reboot a node", runReboot}
	commands["decommission"] = command{"remove a node from the cluster for good (-yes to confirm)", runDecommission}
}

// callTimeout bounds one non-streaming command.
const callTimeout = 30 * time.Second

func configFlag(fs *flag.FlagSet) *string {
	def := os.Getenv("PLINTH_CONFIG")
	if def == "" {
		def, _ = owner.DefaultDir()
	}
	return fs.String("config", def, "owner configuration `dir` (default $PLINTH_CONFIG, else $XDG_CONFIG_HOME/plinth)")
}

// parseArgs parses flags anywhere among the positional arguments, so that
// `nodes describe ID -o json` works as well as `nodes describe -o json ID`.
func parseArgs(fs *flag.FlagSet, args []string) ([]string, error) {
	var pos []string
	for {
		if err := fs.Parse(args); err != nil {
			return nil, err
		}
		args = fs.Args()
		if len(args) == 0 {
			return pos, nil
		}
		if args[0] == "--" {
			return append(pos, args[1:]...), nil
		}
		pos, args = append(pos, args[0]), args[1:]
	}
}

// noArgs parses flags and refuses positional arguments.
func noArgs(fs *flag.FlagSet, args []string) error {
	pos, err := parseArgs(fs, args)
	if err == nil && len(pos) > 0 {
		err = fmt.Errorf("unexpected arguments %q", pos)
	}
	return err
}

func dialOwner(dir string) (*owner.Client, error) {
	cfg, err := owner.LoadConfig(dir)
	if err != nil {
		if errors.Is(err, os.ErrNotExist) {
			return nil, fmt.Errorf("no owner configuration in %s (run plinthctl takeownership, or pass -config)", dir)
		}
		return nil, err
	}
	return owner.Dial(cfg)
}

func runTakeOwnership(ctx context.Context, args []string) error {
	fs := flag.NewFlagSet("takeownership", flag.ExitOnError)
	dir := configFlag(fs)
	var endpoints paramsListFlag
	fs.Var(&endpoints, "endpoint", "the bootstrap node's curator `host:port` (repeat or comma-separate for more curators)")
	keyFile := fs.String("owner-key", "", "owner private key `file` written by plinthctl params -bootstrap (default: owner.key in the configuration dir)")
	directory := fs.Bool("directory-endpoints", true, "also use the curator addresses the cluster directory names (ignored unless given when every -endpoint is loopback, e.g. a forwarded port)")
	mgmtEndpoint := fs.String("mgmt-endpoint", "", "`host:port` where the bootstrap node's NodeManagement is reached (e.g. the 127.0.0.1 port plinthctl run forwards), recorded for it in the endpoints file")
	force := fs.Bool("force", false, "replace an existing owner certificate in the configuration dir")
	if err := noArgs(fs, args); err != nil {
		return err
	}
	if len(endpoints) == 0 {
		return errors.New("-endpoint HOST:PORT is required")
	}
	if *mgmtEndpoint != "" {
		if _, _, err := net.SplitHostPort(*mgmtEndpoint); err != nil {
			return fmt.Errorf("-mgmt-endpoint: %w", err)
		}
	}
	if !flagSet(fs, "directory-endpoints") && allLoopback(endpoints) {
		// The directory names the node's own addresses, which the host
		// cannot reach through forwarded ports.
		*directory = false
	}
	if *keyFile == "" {
		*keyFile = filepath.Join(*dir, owner.KeyFile)
	}
	key, err := owner.ReadKeyFile(*keyFile)
	if err != nil {
		return fmt.Errorf("%w (pass -owner-key, the owner.key plinthctl params wrote)", err)
	}
	cfg, err := owner.LoadConfig(*dir)
	if errors.Is(err, os.ErrNotExist) {
		cfg, err = &owner.Config{Dir: *dir, NodeEndpoints: map[string]string{}}, nil
	}
	if err != nil {
		return err
	}
	if cfg.Credentials != nil && !*force {
		return fmt.Errorf("%s already holds an owner certificate; use another -config or -force", *dir)
	}
	tctx, cancel := context.WithTimeout(ctx, callTimeout)
	defer cancel()
	creds, info, err := owner.TakeOwnership(tctx, endpoints[0], key)
	if err != nil {
		return err
	}
	cfg.Key, cfg.Credentials, cfg.Curators = key, creds, slices.Clone(endpoints)
	if *directory {
		for _, d := range info.GetDirectory().GetNodes() {
			for _, a := range d.GetAddresses() {
				if ep := net.JoinHostPort(a, strconv.Itoa(layout.CuratorPort)); !slices.Contains(cfg.Curators, ep) {
					cfg.Curators = append(cfg.Curators, ep)
				}
			}
		}
	}
	if *mgmtEndpoint != "" {
		// A fresh cluster's directory is the bootstrap node alone.
		d := info.GetDirectory().GetNodes()
		if len(d) != 1 || d[0].GetId() == "" {
			return fmt.Errorf("-mgmt-endpoint: the cluster directory lists %d nodes, want the bootstrap node alone (add a \"node ID HOST:PORT\" line to %s instead)",
				len(d), filepath.Join(*dir, owner.EndpointsFile))
		}
		if cfg.NodeEndpoints == nil {
			cfg.NodeEndpoints = map[string]string{}
		}
		cfg.NodeEndpoints[d[0].GetId()] = *mgmtEndpoint
	}
	if err := cfg.Save(); err != nil {
		return err
	}
	fmt.Fprintf(os.Stderr, "plinthctl: you own the cluster (CA %q); owner configuration saved in %s, curators %s\n",
		creds.CA.Subject.CommonName, *dir, strings.Join(cfg.Curators, ", "))
	for id, ep := range cfg.NodeEndpoints {
		fmt.Fprintf(os.Stderr, "plinthctl: node %s: NodeManagement at %s\n", id, ep)
	}
	return nil
}

// flagSet reports whether the flag name was given on the command line.
func flagSet(fs *flag.FlagSet, name string) bool {
	set := false
	fs.Visit(func(f *flag.Flag) { set = set || f.Name == name })
	return set
}

// allLoopback reports whether every endpoint's host is a loopback address
// or localhost.
func allLoopback(endpoints []string) bool {
	for _, ep := range endpoints {
		host, _, err := net.SplitHostPort(ep)
		if err != nil {
			return false
		}
		if ip := net.ParseIP(host); host != "localhost" && (ip == nil || !ip.IsLoopback()) {
			return false
		}
	}
	return len(endpoints) > 0
}

func runNodes(ctx context.Context, args []string) error {
	if len(args) == 0 {
		return errors.New("usage: plinthctl nodes list [-o table|json] | nodes describe [-o text|json] NODE")
	}
	sub, args := args[0], args[1:]
	fs := flag.NewFlagSet("nodes "+sub, flag.ExitOnError)
	dir := configFlag(fs)
	format := fs.String("o", "", "output format: table (list), text (describe) or json")
	pos, err := parseArgs(fs, args)
	if err != nil {
		return err
	}
	c, err := dialOwner(*dir)
	if err != nil {
		return err
	}
	defer c.Close()
	ctx, cancel := context.WithTimeout(ctx, callTimeout)
	defer cancel()
	nodes, err := c.Nodes(ctx)
	if err != nil {
		return err
	}
	switch sub {
	case "list", "ls":
		if len(pos) > 0 {
			return fmt.Errorf("unexpected arguments %q", pos)
		}
		switch *format {
		case "", "table":
			return printNodeTable(os.Stdout, nodes, time.Now())
		case "json":
			return printJSON(os.Stdout, nodes, true)
		}
	case "describe":
		if len(pos) != 1 {
			return errors.New("usage: plinthctl nodes describe NODE")
		}
		n, err := owner.MatchNode(nodes, pos[0])
		if err != nil {
			return err
		}
		switch *format {
		case "", "text":
			describeNode(os.Stdout, n, time.Now())
			return nil
		case "json":
			return printJSON(os.Stdout, []*clusterpb.Node{n}, false)
		}
	default:
		return fmt.Errorf("unknown subcommand %q: want list or describe", sub)
	}
	return fmt.Errorf("-o %q: unknown format", *format)
}

func shortState(s clusterpb.NodeState) string {
	return strings.TrimPrefix(s.String(), "NODE_STATE_")
}

func shortHealth(h clusterpb.NodeHealth) string {
	if h == clusterpb.NodeHealth_NODE_HEALTH_UNSPECIFIED {
		return "-"
	}
	return strings.TrimPrefix(h.String(), "NODE_HEALTH_")
}

// roleNames are the roles as the roles command spells them.
func roleNames(r *clusterpb.NodeRoles) []string {
	var out []string
	if r.GetConsensusMember() != nil {
		out = append(out, "consensus-member")
	}
	if r.GetKubernetesController() != nil {
		out = append(out, "kubernetes-controller")
	}
	if r.GetKubernetesWorker() != nil {
		out = append(out, "kubernetes-worker")
	}
	return out
}

func lastSeen(unixNanos int64, now time.Time) string {
	if unixNanos == 0 {
		return "never"
	}
	d := now.Sub(time.Unix(0, unixNanos))
	if d < 0 {
		d = 0
	}
	return d.Round(time.Second).String() + " ago"
}

func orDash(s string) string {
	if s == "" {
		return "-"
	}
	return s
}

func printNodeTable(w io.Writer, nodes []*clusterpb.Node, now time.Time) error {
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "ID\tSTATE\tHEALTH\tADDRESS\tROLES\tETCD\tLAST SEEN")
	for _, n := range nodes {
		var addr string
		if a := n.GetStatus().GetAddresses(); len(a) > 0 {
			addr = a[0]
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\t%s\n", n.GetId(), shortState(n.GetState()), shortHealth(n.GetHealth()),
			orDash(addr), orDash(strings.Join(roleNames(n.GetRoles()), ",")), membership(n),
			lastSeen(n.GetLastHeartbeatUnixNanos(), now))
	}
	return tw.Flush()
}

// membership is the ETCD column: voter, learner, pending (the curator
// adds the member once the learner before it caught up) or -.
func membership(n *clusterpb.Node) string {
	switch n.GetConsensusMembership() {
	case clusterpb.ConsensusMembership_CONSENSUS_MEMBERSHIP_VOTER:
		return "voter"
	case clusterpb.ConsensusMembership_CONSENSUS_MEMBERSHIP_LEARNER:
		return "learner"
	}
	if n.GetConsensusMemberPending() {
		return "pending"
	}
	return "-"
}

func describeNode(w io.Writer, n *clusterpb.Node, now time.Time) {
	st := n.GetStatus()
	boot := "-"
	if t := st.GetBootTimeUnixNanos(); t != 0 {
		boot = time.Unix(0, t).UTC().Format(time.RFC3339)
	}
	fmt.Fprintf(w, "ID:          %s\nPublic key:  %s\nState:       %s\nHealth:      %s (last heartbeat %s)\nTPM:         %s\n",
		n.GetId(), hex.EncodeToString(n.GetPublicKey()), shortState(n.GetState()), shortHealth(n.GetHealth()),
		lastSeen(n.GetLastHeartbeatUnixNanos(), now), strings.TrimPrefix(n.GetTpmUsage().String(), "NODE_TPM_USAGE_"))
	fmt.Fprintf(w, "Addresses:   %s\nVersion:     %s\nBoot count:  %d\nBooted at:   %s\nRoles:       %s\n",
		orDash(strings.Join(st.GetAddresses(), ", ")), orDash(st.GetVersion()), st.GetBootCount(), boot,
		orDash(strings.Join(roleNames(n.GetRoles()), ", ")))
	switch m := membership(n); m {
	case "pending":
		fmt.Fprintf(w, "etcd:        pending (consensus-member given; the curator adds it once the current learner caught up)\n")
	default:
		fmt.Fprintf(w, "etcd:        %s\n", m)
	}
	if cm := n.GetRoles().GetConsensusMember(); cm != nil {
		for _, p := range cm.GetPeers() {
			fmt.Fprintf(w, "  consensus peer %s %s\n", p.GetName(), p.GetUrl())
		}
	}
}

// printJSON prints nodes as a JSON array, or one node as an object, with
// protojson's field names and stable formatting.
func printJSON(w io.Writer, nodes []*clusterpb.Node, array bool) error {
	raws := make([]json.RawMessage, 0, len(nodes))
	for _, n := range nodes {
		b, err := protojson.Marshal(n)
		if err != nil {
			return err
		}
		raws = append(raws, b)
	}
	var v any = raws
	if !array {
		v = raws[0]
	}
	out, err := json.MarshalIndent(v, "", "  ")
	if err != nil {
		return err
	}
	_, err = fmt.Fprintf(w, "%s\n", out)
	return err
}

func runApprove(ctx context.Context, args []string) error {
	fs := flag.NewFlagSet("approve", flag.ExitOnError)
	dir := configFlag(fs)
	pos, err := parseArgs(fs, args)
	if err != nil {
		return err
	}
	c, err := dialOwner(*dir)
	if err != nil {
		return err
	}
	defer c.Close()
	ctx, cancel := context.WithTimeout(ctx, callTimeout)
	defer cancel()
	if len(pos) == 0 {
		nodes, err := c.Nodes(ctx)
		if err != nil {
			return err
		}
		nodes = slices.DeleteFunc(nodes, func(n *clusterpb.Node) bool { return n.GetState() != clusterpb.NodeState_NODE_STATE_NEW })
		if len(nodes) == 0 {
			fmt.Fprintln(os.Stderr, "plinthctl: no node is waiting for approval")
			return nil
		}
		tw := tabwriter.NewWriter(os.Stdout, 0, 4, 2, ' ', 0)
		fmt.Fprintln(tw, "ID\tPUBLIC KEY\tADDRESS\tTPM")
		for _, n := range nodes {
			fmt.Fprintf(tw, "%s\t%s\t%s\t%s\n", n.GetId(), hex.EncodeToString(n.GetPublicKey()),
				orDash(strings.Join(n.GetStatus().GetAddresses(), ",")), strings.TrimPrefix(n.GetTpmUsage().String(), "NODE_TPM_USAGE_"))
		}
		tw.Flush()
		fmt.Fprintln(os.Stderr, "plinthctl: check a key against the node's console, then: plinthctl approve PUBKEY")
		return nil
	}
	for _, ref := range pos {
		pub, err := owner.ParsePublicKey(ref)
		if err != nil {
			n, ferr := c.FindNode(ctx, ref)
			if ferr != nil {
				return ferr
			}
			pub = ed25519.PublicKey(n.GetPublicKey())
		}
		if err := c.Approve(ctx, pub); err != nil {
			return fmt.Errorf("approving %s: %w", identity.NodeID(pub), err)
		}
		fmt.Fprintf(os.Stderr, "plinthctl: approved %s\n", identity.NodeID(pub))
	}
	return nil
}

func runRoles(ctx context.Context, args []string) error {
	fs := flag.NewFlagSet("roles", flag.ExitOnError)
	dir := configFlag(fs)
	pos, err := parseArgs(fs, args)
	if err != nil {
		return err
	}
	if len(pos) < 3 || (pos[0] != "add" && pos[0] != "remove") {
		return errors.New("usage: plinthctl roles add|remove NODE consensus-member|kubernetes-controller|kubernetes-worker...")
	}
	on := pos[0] == "add"
	c, err := dialOwner(*dir)
	if err != nil {
		return err
	}
	defer c.Close()
	ctx, cancel := context.WithTimeout(ctx, callTimeout)
	defer cancel()
	n, err := c.FindNode(ctx, pos[1])
	if err != nil {
		return err
	}
	req := &clusterpb.UpdateNodeRolesRequest{Node: &clusterpb.UpdateNodeRolesRequest_Id{Id: n.GetId()}}
	for _, r := range pos[2:] {
		switch r {
		case "consensus-member", "consensus":
			req.ConsensusMember = proto.Bool(on)
		case "kubernetes-controller", "controller":
			req.KubernetesController = proto.Bool(on)
		case "kubernetes-worker", "worker":
			req.KubernetesWorker = proto.Bool(on)
		default:
			return fmt.Errorf("unknown role %q: want consensus-member, kubernetes-controller or kubernetes-worker", r)
		}
	}
	if err := c.UpdateRoles(ctx, req); err != nil {
		return err
	}
	fmt.Fprintf(os.Stderr, "plinthctl: %s: roles updated\n", n.GetId())
	return nil
}

func runTicket(ctx context.Context, args []string) error {
	fs := flag.NewFlagSet("ticket", flag.ExitOnError)
	dir := configFlag(fs)
	raw := fs.Bool("raw", false, "write the raw ticket bytes instead of base64")
	if err := noArgs(fs, args); err != nil {
		return err
	}
	c, err := dialOwner(*dir)
	if err != nil {
		return err
	}
	defer c.Close()
	ctx, cancel := context.WithTimeout(ctx, callTimeout)
	defer cancel()
	t, err := c.Ticket(ctx)
	if err != nil {
		return err
	}
	if *raw {
		_, err = os.Stdout.Write(t)
		return err
	}
	_, err = fmt.Println(base64.StdEncoding.EncodeToString(t))
	return err
}

// nodeID resolves a NODE argument to a node ID.
func nodeID(ctx context.Context, c *owner.Client, ref string) (string, error) {
	ctx, cancel := context.WithTimeout(ctx, callTimeout)
	defer cancel()
	n, err := c.FindNode(ctx, ref)
	if err != nil {
		return "", err
	}
	return n.GetId(), nil
}

// dialForNode parses the flags of a command that takes one NODE argument,
// connects with the owner credentials and resolves NODE to its ID.
func dialForNode(ctx context.Context, fs *flag.FlagSet, args []string, dir *string, usage string) (*owner.Client, string, error) {
	pos, err := parseArgs(fs, args)
	if err != nil {
		return nil, "", err
	}
	if len(pos) != 1 {
		return nil, "", errors.New(usage)
	}
	c, err := dialOwner(*dir) // after parsing: -config is a flag
	if err != nil {
		return nil, "", err
	}
	id, err := nodeID(ctx, c, pos[0])
	if err != nil {
		c.Close()
		return nil, "", err
	}
	return c, id, nil
}

func runLogs(ctx context.Context, args []string) error {
	fs := flag.NewFlagSet("logs", flag.ExitOnError)
	dir := configFlag(fs)
	follow := fs.Bool("f", false, "keep printing new entries")
	dn := fs.String("dn", "", "log tree `DN` to read (default the root)")
	recursive := fs.Bool("r", true, "include every DN below -dn")
	backlog := fs.Int64("n", -1, "past entries to print first (-1 all, 0 none)")
	c, id, err := dialForNode(ctx, fs, args, dir, "usage: plinthctl logs [-f] [-dn DN] [-n N] NODE")
	if err != nil {
		return err
	}
	defer c.Close()
	if !*follow {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, 2*callTimeout)
		defer cancel()
	}
	err = c.Logs(ctx, id, &clusterpb.LogsRequest{Dn: *dn, Recursive: *recursive, Backlog: *backlog, Follow: *follow},
		func(e *clusterpb.LogEntry) error {
			_, err := fmt.Println(formatLogEntry(e))
			return err
		})
	if *follow && ctx.Err() != nil {
		return nil // Ctrl-C ends -f
	}
	return err
}

// formatLogEntry prints an entry like the node's console does, with a
// timestamp in front.
func formatLogEntry(e *clusterpb.LogEntry) string {
	level := e.GetLevel()
	if level != "" && level != "RAW" {
		level = level[:1]
	}
	var b strings.Builder
	b.WriteString(time.Unix(0, e.GetTimeUnixNanos()).Format("2006-01-02 15:04:05.000000 "))
	if level != "" {
		b.WriteString(level + " ")
	}
	b.WriteString(e.GetDn() + ": " + e.GetMessage())
	for _, a := range e.GetAttributes() {
		b.WriteString(" " + a)
	}
	return b.String()
}

func runReboot(ctx context.Context, args []string) error {
	fs := flag.NewFlagSet("reboot", flag.ExitOnError)
	dir := configFlag(fs)
	c, id, err := dialForNode(ctx, fs, args, dir, "usage: plinthctl reboot NODE")
	if err != nil {
		return err
	}
	defer c.Close()
	ctx, cancel := context.WithTimeout(ctx, callTimeout)
	defer cancel()
	if err := c.Reboot(ctx, id); err != nil {
		return err
	}
	fmt.Fprintf(os.Stderr, "plinthctl: %s is rebooting\n", id)
	return nil
}

func runDecommission(ctx context.Context, args []string) error {
	fs := flag.NewFlagSet("decommission", flag.ExitOnError)
	dir := configFlag(fs)
	yes := fs.Bool("yes", false, "confirm: the node can never rejoin and its data volume can no longer be unlocked through the cluster")
	c, id, err := dialForNode(ctx, fs, args, dir, "usage: plinthctl decommission -yes NODE")
	if err != nil {
		return err
	}
	defer c.Close()
	if !*yes {
		return fmt.Errorf("decommissioning %s cannot be undone: run again with -yes", id)
	}
	ctx, cancel := context.WithTimeout(ctx, callTimeout)
	defer cancel()
	if err := c.Decommission(ctx, id); err != nil {
		return err
	}
	fmt.Fprintf(os.Stderr, "plinthctl: %s is decommissioned\n", id)
	return nil
}
