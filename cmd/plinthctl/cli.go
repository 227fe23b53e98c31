package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"regexp"
	"slices"
	"strings"

	"github.com/spf13/cobra"
	"github.com/spf13/pflag"
)

// The command tree. Every command file adds one spec from its init; the
// tree is built fresh for each execution (tests run many):
//
//	plinthctl ─┬─ node ─── list describe approve status logs reboot poweroff decommission update
//	           ├─ role ─── add remove taint untaint
//	           ├─ cluster ─ takeownership policy ticket kubeconfig owner-key secrets-key update
//	           ├─ release ─ key
//	           ├─ build run launch write-disk params fetch-kernel   (images and machines)
//	           └─ version completion help   (kubernetes-credential, hidden)
//
// Flags are POSIX (pflag): --config, --endpoint and -o/--output are
// global. A flag spelled with one dash, as before, and an old verb are
// refused with the new spelling (TestLegacySpellings).

// A command is one plinthctl command: its own flags, and what it does
// with its positional arguments once cobra has checked their number.
type command interface {
	flags(fs *pflag.FlagSet)
	run(ctx context.Context, e *env, args []string) error
}

// A spec places a command in the tree.
type spec struct {
	path  string // the words after plinthctl: "node reboot"
	args  string // the positional arguments as usage shows them: "NODE"
	short string
	long  string
	// minArgs and maxArgs bound the positional arguments (maxArgs -1:
	// no bound).
	minArgs, maxArgs int
	// formats are the -o formats the command prints, its default first;
	// nil for a command that prints no object (-o is refused).
	formats []string
	group   string   // top-level commands only
	aliases []string // other names, such as ls for list
	hidden  bool     // left out of help and the reference
	// rawArgs: cobra parses no flags; run gets every argument (a command
	// whose callers keep a spelling of their own, such as
	// kubernetes-credential's -config in users' kubeconfigs).
	rawArgs bool
	new     func() command
}

var specs []spec

// add registers a command; each command's file calls it from init.
func add(s spec) { specs = append(specs, s) }

// Groups of top-level commands in plinthctl --help.
const (
	groupCluster = "cluster"
	groupImage   = "image"
	groupOther   = "other"
)

// nouns are the commands that only group others: the top-level ones
// first.
var nouns = []struct{ path, short string }{
	{"node", "Act on one node of the cluster, or list them"},
	{"role", "Give nodes roles or take them away"},
	{"cluster", "Act on the cluster as a whole: ownership, policy, access, keys, updates"},
	{"release", "Make release keys, which sign images"},
	{"cluster secrets-key", "The key Kubernetes Secrets are encrypted with inside etcd: its status, its rotation"},
}

// Formats of -o.
var (
	readFormats = []string{"table", "json", "yaml"}
	textFormats = []string{"text", "json", "yaml"}
)

// env is what every command gets: its output streams and the global
// flags.
type env struct {
	stdout, stderr io.Writer
	config         string   // --config: the owner configuration directory
	endpoints      []string // --endpoint: curators to use instead of the configuration's
	output         string   // -o: the format, one of the command's formats
}

// A usageError is wrong usage: plinthctl prints the reason and the
// command's usage, and exits 2.
type usageError struct{ err error }

func (u usageError) Error() string { return u.err.Error() }
func (u usageError) Unwrap() error { return u.err }

func usagef(format string, a ...any) error { return usageError{fmt.Errorf(format, a...)} }

// newRoot builds the command tree writing to stdout and stderr.
func newRoot(stdout, stderr io.Writer) (*cobra.Command, *env) {
	e := &env{stdout: stdout, stderr: stderr}
	root := &cobra.Command{
		Use:   "plinthctl",
		Short: "Build Plinth node images and operate Plinth clusters",
		Long: "plinthctl builds Plinth node images, boots them in QEMU, and operates a\n" +
			"Plinth cluster as its owner (over mTLS with the owner's certificate).",
		SilenceErrors:     true,
		SilenceUsage:      true,
		CompletionOptions: cobra.CompletionOptions{HiddenDefaultCmd: false},
		Args:              unknownCommand,
		RunE:              func(*cobra.Command, []string) error { return usagef("missing command") },
	}
	root.SetOut(stdout)
	root.SetErr(stderr)
	root.SetFlagErrorFunc(func(_ *cobra.Command, err error) error { return usageError{err} })
	root.AddGroup(
		&cobra.Group{ID: groupCluster, Title: "Cluster commands (as the cluster's owner):"},
		&cobra.Group{ID: groupImage, Title: "Images and machines:"},
		&cobra.Group{ID: groupOther, Title: "Other commands:"},
	)
	root.SetHelpCommandGroupID(groupOther)
	root.SetCompletionCommandGroupID(groupOther)
	pf := root.PersistentFlags()
	pf.StringVar(&e.config, "config", "", "owner configuration `dir` (default $PLINTH_CONFIG, else $XDG_CONFIG_HOME/plinth or ~/.config/plinth)")
	pf.StringSliceVar(&e.endpoints, "endpoint", nil, "curator `host:port` to reach the cluster through instead of the configuration's (repeat or comma-separate)")
	pf.StringVarP(&e.output, "output", "o", "", "output `format` of commands that print objects: table (or text) by default, json or yaml")

	parents := map[string]*cobra.Command{"": root}
	for _, n := range nouns {
		words := strings.Fields(n.path)
		c := &cobra.Command{Use: words[len(words)-1], Short: n.short, Args: unknownCommand,
			RunE: func(*cobra.Command, []string) error { return usagef("missing subcommand") }}
		if len(words) == 1 {
			c.GroupID = groupCluster
		}
		parents[strings.Join(words[:len(words)-1], " ")].AddCommand(c)
		parents[n.path] = c
	}
	for _, s := range specs {
		words := strings.Fields(s.path)
		parents[strings.Join(words[:len(words)-1], " ")].AddCommand(s.command(e))
	}
	return root, e
}

// command is the cobra command of s, running a fresh s.new() with e.
func (s spec) command(e *env) *cobra.Command {
	cmd := s.new()
	use := strings.Fields(s.path)
	c := &cobra.Command{
		Use:                use[len(use)-1] + " " + s.args,
		Short:              s.short,
		Long:               s.long,
		GroupID:            s.group,
		Aliases:            s.aliases,
		Hidden:             s.hidden,
		Args:               s.checkArgs,
		DisableFlagParsing: s.rawArgs,
		RunE: func(c *cobra.Command, args []string) error {
			if err := s.checkOutput(e); err != nil {
				return err
			}
			if e.config == "" {
				e.config = defaultConfigDir()
			}
			return cmd.run(c.Context(), e, args)
		},
	}
	if s.args == "" {
		c.Use = use[len(use)-1]
	}
	cmd.flags(c.Flags())
	return c
}

func (s spec) checkArgs(_ *cobra.Command, args []string) error {
	switch {
	case len(args) < s.minArgs:
		return usagef("missing arguments: want %s", s.args)
	case s.maxArgs >= 0 && len(args) > s.maxArgs:
		return usagef("unexpected arguments %q", args[s.maxArgs:])
	}
	return nil
}

// checkOutput refuses an -o the command does not print, and sets the
// default.
func (s spec) checkOutput(e *env) error {
	switch {
	case e.output == "" && len(s.formats) > 0:
		e.output = s.formats[0]
	case e.output == "":
	case len(s.formats) == 0:
		return usagef("-o %s: plinthctl %s prints no object", e.output, s.path)
	case !slices.Contains(s.formats, e.output):
		return usagef("-o %s: unknown format, want %s", e.output, strings.Join(s.formats, ", "))
	}
	return nil
}

// unknownCommand is the Args check of commands that only group others.
func unknownCommand(c *cobra.Command, args []string) error {
	if len(args) == 0 {
		return nil
	}
	msg := fmt.Sprintf("unknown command %q for %q", args[0], c.CommandPath())
	if s := c.SuggestionsFor(args[0]); len(s) > 0 {
		msg += "; did you mean " + strings.Join(s, " or ") + "?"
	}
	return usageError{errors.New(msg)}
}

// execute runs plinthctl with args (without the program name) and
// returns its exit code: 0, 1 for a failure, 2 for wrong usage.
func execute(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	if msg := legacyVerb(args); msg != "" {
		fmt.Fprintf(stderr, "plinthctl: %s\n", msg)
		return 2
	}
	root, _ := newRoot(stdout, stderr)
	if args == nil {
		args = []string{}
	}
	root.SetArgs(args)
	target, _, _ := root.Find(args)
	if target != nil {
		if msg := singleDashFlag(target, args); msg != "" {
			fmt.Fprintf(stderr, "%s: %s\n", target.CommandPath(), msg)
			return 2
		}
	}
	cmd, err := root.ExecuteContextC(ctx)
	if err == nil {
		return 0
	}
	if cmd == nil {
		cmd = root
	}
	if u := (usageError{}); errors.As(err, &u) {
		fmt.Fprintf(stderr, "%s: %v\n\n%s", cmd.CommandPath(), err, cmd.UsageString())
		return 2
	}
	fmt.Fprintf(stderr, "%s: %v\n", cmd.CommandPath(), err)
	return 1
}

// renamed are the verbs of plinthctl before its commands took nouns.
var renamed = map[string]string{
	"approve":       "node approve",
	"nodes":         "node list, node describe",
	"status":        "node status",
	"logs":          "node logs",
	"reboot":        "node reboot",
	"decommission":  "node decommission",
	"update":        "node update NODE, or cluster update for every node",
	"roles":         "role add, role remove, role taint, role untaint",
	"takeownership": "cluster takeownership",
	"policy":        "cluster policy",
	"ticket":        "cluster ticket",
	"kubeconfig":    "cluster kubeconfig",
	"owner-key":     "cluster owner-key",
	"secrets-key":   "cluster secrets-key",
	"release-key":   "release key",
}

// legacyVerb says what an old verb is called now, or "".
func legacyVerb(args []string) string {
	if len(args) == 0 {
		return ""
	}
	if now, ok := renamed[args[0]]; ok {
		return fmt.Sprintf("%q is now: plinthctl %s (see plinthctl --help)", args[0], now)
	}
	return ""
}

var singleDash = regexp.MustCompile(`^-([A-Za-z][A-Za-z0-9-]+)(=.*)?$`)

// singleDashFlag says how to spell a long flag given with one dash, as
// plinthctl's flags were: pflag would read -config as -c -o -n -f -i -g.
func singleDashFlag(c *cobra.Command, args []string) string {
	if c.DisableFlagParsing {
		return ""
	}
	for _, a := range args {
		if a == "--" {
			break
		}
		m := singleDash.FindStringSubmatch(a)
		if m == nil {
			continue
		}
		if longFlag(c, m[1]) {
			return fmt.Sprintf("flags take two dashes: --%s, not -%s", m[1], m[1])
		}
	}
	return ""
}

// longFlag reports whether c or a parent of it has the persistent flag
// name.
func longFlag(c *cobra.Command, name string) bool {
	if c.Flags().Lookup(name) != nil {
		return true
	}
	for p := c; p != nil; p = p.Parent() {
		if p.PersistentFlags().Lookup(name) != nil {
			return true
		}
	}
	return false
}
