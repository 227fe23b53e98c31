package main

import (
	"context"
	"fmt"

	"github.com/spf13/pflag"

	"plinth.dev/plinth/roleserver/owner"
)

func init() {
	add(spec{path: "node reboot", args: "NODE", short: "Reboot a node", minArgs: 1, maxArgs: 1,
		new: func() command { return &powerCmd{verb: "rebooting", call: (*owner.Client).Reboot} }})
	add(spec{path: "node poweroff", args: "NODE", short: "Power a node off (it comes back only from its power button or BMC)", minArgs: 1, maxArgs: 1,
		new: func() command { return &powerCmd{verb: "powering off", call: (*owner.Client).PowerOff} }})
}

// powerCmd is `plinthctl node reboot NODE` and `plinthctl node poweroff
// NODE`: one NodeManagement call on the node.
type powerCmd struct {
	verb string
	call func(*owner.Client, context.Context, string) error
}

func (c *powerCmd) flags(*pflag.FlagSet) {}

func (c *powerCmd) run(ctx context.Context, e *env, args []string) error {
	cl, id, err := e.dialNode(ctx, args[0])
	if err != nil {
		return err
	}
	defer cl.Close()
	ctx, cancel := context.WithTimeout(ctx, callTimeout)
	defer cancel()
	if err := c.call(cl, ctx, id); err != nil {
		return err
	}
	fmt.Fprintf(e.stderr, "plinthctl: %s is %s\n", id, c.verb)
	return nil
}
