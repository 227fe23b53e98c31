package main

import (
	"flag"
	"fmt"
	"io"
	"os"
	"strings"

	"plinth.dev/plinth/roleserver/owner"
)

// newFlagSet is a verb's flag set: errors and -h print its usage to
// stderr and exit, as the flag package does by default.
func newFlagSet(name string, stderr io.Writer) *flag.FlagSet {
	fs := flag.NewFlagSet(name, flag.ExitOnError)
	fs.SetOutput(stderr)
	return fs
}

// configFlagVar defines -config, the owner configuration directory.
func configFlagVar(fs *flag.FlagSet, p *string) {
	def := os.Getenv("PLINTH_CONFIG")
	if def == "" {
		def, _ = owner.DefaultDir()
	}
	fs.StringVar(p, "config", def, "owner configuration `dir` (default $PLINTH_CONFIG, else $XDG_CONFIG_HOME/plinth)")
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

// flagSet reports whether the flag name was given on the command line.
func flagSet(fs *flag.FlagSet, name string) bool {
	set := false
	fs.Visit(func(f *flag.Flag) { set = set || f.Name == name })
	return set
}

// listFlag collects a flag given several times, or once with commas.
type listFlag []string

func (l *listFlag) String() string { return strings.Join(*l, ",") }

func (l *listFlag) Set(v string) error {
	for s := range strings.SplitSeq(v, ",") {
		if s = strings.TrimSpace(s); s != "" {
			*l = append(*l, s)
		}
	}
	return nil
}
