package main

import (
	"context"
	"encoding/base64"
	"fmt"
	"io"
)

func init() {
	register("ticket", "print the cluster's register ticket (base64); -rotate replaces it with a new one", func() verb { return new(ticketCmd) })
}

// ticketCmd is `plinthctl ticket [-rotate] [-raw]`.
//
// The register ticket is what lets a new node ask to join (it still needs
// the owner's approval). It stays the same until rotated, so it can be
// baked into provisioning media; -rotate is for when such media or a
// parameters file went astray.
type ticketCmd struct {
	config string
	raw    bool
	rotate bool
}

// rotateNotice says what a rotation changed.
const rotateNotice = `plinthctl: the register ticket was rotated: the old ticket stops working at once.
plinthctl: nodes that already registered are not affected; parameters files and
plinthctl: provisioning media with the old ticket are: make new ones with plinthctl params -register.
`

func (c *ticketCmd) run(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs := newFlagSet("ticket", stderr)
	configFlagVar(fs, &c.config)
	fs.BoolVar(&c.raw, "raw", false, "write the raw ticket bytes instead of base64")
	fs.BoolVar(&c.rotate, "rotate", false, "replace the ticket with a new random one and print that (the old one stops working; registered nodes are not affected)")
	if err := noArgs(fs, args); err != nil {
		return err
	}
	cl, ctx, done, err := ownerCall(ctx, c.config)
	if err != nil {
		return err
	}
	defer done()
	get := cl.Ticket
	if c.rotate {
		get = cl.RotateTicket
	}
	t, err := get(ctx)
	if err != nil {
		return err
	}
	if c.raw {
		_, err = stdout.Write(t)
	} else {
		_, err = fmt.Fprintln(stdout, base64.StdEncoding.EncodeToString(t))
	}
	if c.rotate {
		fmt.Fprint(stderr, rotateNotice)
	}
	return err
}
