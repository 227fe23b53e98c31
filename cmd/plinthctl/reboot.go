package main

import (
	"context"
	"fmt"
	"io"
)

func init() {
	register("reboot", "reboot a node", func() verb { return new(rebootCmd) })
}

// rebootCmd is `plinthctl reboot NODE`.
type rebootCmd struct {
	config string
}

func (c *rebootCmd) run(ctx context.Context, args []string, _, stderr io.Writer) error {
	fs := newFlagSet("reboot", stderr)
	configFlagVar(fs, &c.config)
	cl, id, err := dialForNode(ctx, fs, args, &c.config, "usage: plinthctl reboot NODE")
	if err != nil {
		return err
	}
	defer cl.Close()
	ctx, cancel := context.WithTimeout(ctx, callTimeout)
	defer cancel()
	if err := cl.Reboot(ctx, id); err != nil {
		return err
	}
	fmt.Fprintf(stderr, "plinthctl: %s is rebooting\n", id)
	return nil
}
