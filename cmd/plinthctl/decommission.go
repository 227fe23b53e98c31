package main

import (
	"context"
	"fmt"

	"github.com/spf13/pflag"
)

func init() {
	add(spec{path: "node decommission", args: "NODE", short: "Remove a node from the cluster for good (--yes to confirm)",
		long: "Remove NODE from the cluster for good: it can never rejoin, and its data volume can no\n" +
			"longer be unlocked through the cluster. It cannot be undone, hence --yes.",
		minArgs: 1, maxArgs: 1, new: func() command { return new(decommissionCmd) }})
}

// decommissionCmd is `plinthctl node decommission --yes NODE`.
type decommissionCmd struct {
	yes bool
}

func (c *decommissionCmd) flags(fs *pflag.FlagSet) {
	fs.BoolVar(&c.yes, "yes", false, "confirm: the node can never rejoin and its data volume can no longer be unlocked through the cluster")
}

func (c *decommissionCmd) run(ctx context.Context, e *env, args []string) error {
	if !c.yes {
		return usagef("decommissioning %s cannot be undone: it can never rejoin the cluster and its data volume can no longer be unlocked through the cluster; run again with --yes", args[0])
	}
	cl, id, err := e.dialNode(ctx, args[0])
	if err != nil {
		return err
	}
	defer cl.Close()
	ctx, cancel := context.WithTimeout(ctx, callTimeout)
	defer cancel()
	if err := cl.Decommission(ctx, id); err != nil {
		return err
	}
	fmt.Fprintf(e.stderr, "plinthctl: %s is decommissioned\n", id)
	return nil
}
