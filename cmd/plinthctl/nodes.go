package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"time"

	"plinth.dev/plinth/api/clusterpb"
	"plinth.dev/plinth/roleserver/owner"
)

func init() {
	register("nodes", "list or describe the cluster's nodes (nodes list | nodes describe NODE)", func() verb { return new(nodesCmd) })
}

// nodesCmd is `plinthctl nodes list|describe`.
type nodesCmd struct {
	config string
	format string // -o
}

func (c *nodesCmd) run(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	if len(args) == 0 {
		return errors.New("usage: plinthctl nodes list [-o table|json] | nodes describe [-o text|json] NODE")
	}
	sub, args := args[0], args[1:]
	fs := newFlagSet("nodes "+sub, stderr)
	configFlagVar(fs, &c.config)
	fs.StringVar(&c.format, "o", "", "output format: table (list), text (describe) or json")
	pos, err := parseArgs(fs, args)
	if err != nil {
		return err
	}
	cl, ctx, done, err := ownerCall(ctx, c.config)
	if err != nil {
		return err
	}
	defer done()
	nodes, err := cl.Nodes(ctx)
	if err != nil {
		return err
	}
	switch sub {
	case "list", "ls":
		if len(pos) > 0 {
			return fmt.Errorf("unexpected arguments %q", pos)
		}
		switch c.format {
		case "", "table":
			return printNodeTable(stdout, nodes, time.Now())
		case "json":
			return printJSON(stdout, nodes, true)
		}
	case "describe":
		if len(pos) != 1 {
			return errors.New("usage: plinthctl nodes describe NODE")
		}
		n, err := owner.MatchNode(nodes, pos[0])
		if err != nil {
			return err
		}
		switch c.format {
		case "", "text":
			describeNode(stdout, n, time.Now())
			return nil
		case "json":
			return printJSON(stdout, []*clusterpb.Node{n}, false)
		}
	default:
		return fmt.Errorf("unknown subcommand %q: want list or describe", sub)
	}
	return fmt.Errorf("-o %q: unknown format", c.format)
}
