package main

import (
	"context"
	"io"
	"time"

	"github.com/spf13/pflag"

	"plinth.dev/plinth/roleserver/owner"
)

func init() {
	add(spec{path: "node list", short: "List the cluster's nodes", maxArgs: 0, formats: readFormats, aliases: []string{"ls"},
		new: func() command { return new(nodeListCmd) }})
	add(spec{path: "node describe", args: "NODE", short: "Describe one node: identity, state, roles, addresses, versions",
		minArgs: 1, maxArgs: 1, formats: textFormats, new: func() command { return new(nodeDescribeCmd) }})
}

// nodeListCmd is `plinthctl node list`.
type nodeListCmd struct{}

func (c *nodeListCmd) flags(*pflag.FlagSet) {}

func (c *nodeListCmd) run(ctx context.Context, e *env, _ []string) error {
	cl, ctx, done, err := e.call(ctx)
	if err != nil {
		return err
	}
	defer done()
	nodes, err := cl.Nodes(ctx)
	if err != nil {
		return err
	}
	return e.show(nodes, func(w io.Writer) error { return printNodeTable(w, nodes, time.Now()) })
}

// nodeDescribeCmd is `plinthctl node describe NODE`.
type nodeDescribeCmd struct{}

func (c *nodeDescribeCmd) flags(*pflag.FlagSet) {}

func (c *nodeDescribeCmd) run(ctx context.Context, e *env, args []string) error {
	cl, ctx, done, err := e.call(ctx)
	if err != nil {
		return err
	}
	defer done()
	nodes, err := cl.Nodes(ctx)
	if err != nil {
		return err
	}
	n, err := owner.MatchNode(nodes, args[0])
	if err != nil {
		return err
	}
	return e.show(n, func(w io.Writer) error { describeNode(w, n, time.Now()); return nil })
}
