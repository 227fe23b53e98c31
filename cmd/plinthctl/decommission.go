package main

import (
	"context"
	"fmt"
	"io"
)

func init() {
	register("decommission", "remove a node from the cluster for good (-yes to confirm)", func() verb { return new(decommissionCmd) })
}

// decommissionCmd is `plinthctl decommission -yes NODE`. It cannot be
// undone, hence -yes.
type decommissionCmd struct {
	config string
	yes    bool
}

func (c *decommissionCmd) run(ctx context.Context, args []string, _, stderr io.Writer) error {
	fs := newFlagSet("decommission", stderr)
	configFlagVar(fs, &c.config)
	fs.BoolVar(&c.yes, "yes", false, "confirm: the node can never rejoin and its data volume can no longer be unlocked through the cluster")
	cl, id, err := dialForNode(ctx, fs, args, &c.config, "usage: plinthctl decommission -yes NODE")
	if err != nil {
		return err
	}
	defer cl.Close()
	if !c.yes {
		return fmt.Errorf("decommissioning %s cannot be undone: run again with -yes", id)
	}
	ctx, cancel := context.WithTimeout(ctx, callTimeout)
	defer cancel()
	if err := cl.Decommission(ctx, id); err != nil {
		return err
	}
	fmt.Fprintf(stderr, "plinthctl: %s is decommissioned\n", id)
	return nil
}
