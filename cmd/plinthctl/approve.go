package main

import (
	"context"
	"crypto/ed25519"
	"fmt"
	"io"
	"slices"

	"github.com/spf13/pflag"

	"plinth.dev/plinth/api/clusterpb"
	"plinth.dev/plinth/roleserver/identity"
	"plinth.dev/plinth/roleserver/owner"
)

func init() {
	add(spec{path: "node approve", args: "[PUBKEY|NODE...]", short: "Approve NEW nodes; without arguments, list those waiting",
		long: "Without arguments, list the nodes waiting for approval (state NEW) with their public keys:\n" +
			"compare a key with the one the node's console shows, then approve the node by its key\n" +
			"(hex or base64) or by its ID. -o applies to the list.",
		minArgs: 0, maxArgs: -1, formats: readFormats, new: func() command { return new(approveCmd) }})
}

// approveCmd is `plinthctl node approve [PUBKEY|NODE...]`: without
// arguments it lists the nodes waiting for approval, so that the owner
// can compare their keys with the nodes' consoles first.
type approveCmd struct{}

func (c *approveCmd) flags(*pflag.FlagSet) {}

func (c *approveCmd) run(ctx context.Context, e *env, args []string) error {
	if len(args) > 0 && e.output != "table" {
		return usagef("-o %s: only the list of nodes waiting (no arguments) is printed; approving prints nothing", e.output)
	}
	cl, ctx, done, err := e.call(ctx)
	if err != nil {
		return err
	}
	defer done()
	if len(args) == 0 {
		return c.list(ctx, e, cl)
	}
	for _, ref := range args {
		pub, err := owner.ParsePublicKey(ref)
		if err != nil {
			n, ferr := cl.FindNode(ctx, ref)
			if ferr != nil {
				return ferr
			}
			pub = ed25519.PublicKey(n.GetPublicKey())
		}
		if err := cl.Approve(ctx, pub); err != nil {
			return fmt.Errorf("approving %s: %w", identity.NodeID(pub), err)
		}
		fmt.Fprintf(e.stderr, "plinthctl: approved %s\n", identity.NodeID(pub))
	}
	return nil
}

// list prints the NEW nodes; the table comes with what to do next.
func (c *approveCmd) list(ctx context.Context, e *env, cl *owner.Client) error {
	nodes, err := cl.Nodes(ctx)
	if err != nil {
		return err
	}
	nodes = slices.DeleteFunc(nodes, func(n *clusterpb.Node) bool { return n.GetState() != clusterpb.NodeState_NODE_STATE_NEW })
	return e.show(nodes, func(w io.Writer) error {
		if len(nodes) == 0 {
			fmt.Fprintln(e.stderr, "plinthctl: no node is waiting for approval")
			return nil
		}
		if err := printPendingTable(w, nodes); err != nil {
			return err
		}
		fmt.Fprintln(e.stderr, "plinthctl: check a key against the node's console, then: plinthctl node approve PUBKEY")
		return nil
	})
}
