package main

import (
	"context"
	"encoding/base64"
	"fmt"
	"io"

	"github.com/spf13/pflag"
)

func init() {
	add(spec{path: "cluster ticket", short: "Print the cluster's register ticket (base64); --rotate replaces it with a new one",
		maxArgs: 0, formats: textFormats, new: func() command { return new(ticketCmd) }})
}

// ticketCmd is `plinthctl cluster ticket [--rotate] [--raw]`.
//
// The register ticket is what lets a new node ask to join (it still needs
// the owner's approval). It stays the same until rotated, so it can be
// baked into provisioning media; --rotate is for when such media or a
// parameters file went astray.
type ticketCmd struct {
	raw    bool
	rotate bool
}

// ticketOutput is the ticket as -o json and yaml print it.
type ticketOutput struct {
	Ticket string `json:"ticket"` // base64
}

// rotateNotice says what a rotation changed.
const rotateNotice = `plinthctl: the register ticket was rotated: the old ticket stops working at once.
plinthctl: nodes that already registered are not affected; parameters files and
plinthctl: provisioning media with the old ticket are: make new ones with plinthctl params --register.
`

func (c *ticketCmd) flags(fs *pflag.FlagSet) {
	fs.BoolVar(&c.raw, "raw", false, "write the raw ticket bytes instead of base64 (not with -o json or yaml)")
	fs.BoolVar(&c.rotate, "rotate", false, "replace the ticket with a new random one and print that (the old one stops working; registered nodes are not affected)")
}

func (c *ticketCmd) run(ctx context.Context, e *env, _ []string) error {
	if c.raw && e.output != "text" {
		return usagef("--raw writes the bytes alone: give it without -o %s", e.output)
	}
	cl, ctx, done, err := e.call(ctx)
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
	b64 := base64.StdEncoding.EncodeToString(t)
	if c.raw {
		_, err = e.stdout.Write(t)
	} else {
		err = e.show(ticketOutput{Ticket: b64}, func(w io.Writer) error {
			_, err := fmt.Fprintln(w, b64)
			return err
		})
	}
	if c.rotate {
		fmt.Fprint(e.stderr, rotateNotice)
	}
	return err
}
