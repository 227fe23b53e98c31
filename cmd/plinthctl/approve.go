package main

import (
	"context"
	"crypto/ed25519"
	"fmt"
	"io"
	"slices"

	"plinth.dev/plinth/api/clusterpb"
	"plinth.dev/plinth/roleserver/identity"
	"plinth.dev/plinth/roleserver/owner"
)

func init() {
	register("approve", "approve NEW nodes (without arguments: list them)", func() verb { return new(approveCmd) })
}

// approveCmd is `plinthctl approve [PUBKEY|NODE...]`: without arguments it
// lists the nodes waiting for approval, so that the owner can compare
// their keys with the nodes' consoles first.
type approveCmd struct {
	config string
}

func (c *approveCmd) run(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs := newFlagSet("approve", stderr)
	configFlagVar(fs, &c.config)
	pos, err := parseArgs(fs, args)
	if err != nil {
		return err
	}
	cl, ctx, done, err := ownerCall(ctx, c.config)
	if err != nil {
		return err
	}
	defer done()
	if len(pos) == 0 {
		nodes, err := cl.Nodes(ctx)
		if err != nil {
			return err
		}
		nodes = slices.DeleteFunc(nodes, func(n *clusterpb.Node) bool { return n.GetState() != clusterpb.NodeState_NODE_STATE_NEW })
		if len(nodes) == 0 {
			fmt.Fprintln(stderr, "plinthctl: no node is waiting for approval")
			return nil
		}
		if err := printPendingTable(stdout, nodes); err != nil {
			return err
		}
		fmt.Fprintln(stderr, "plinthctl: check a key against the node's console, then: plinthctl approve PUBKEY")
		return nil
	}
	for _, ref := range pos {
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
		fmt.Fprintf(stderr, "plinthctl: approved %s\n", identity.NodeID(pub))
	}
	return nil
}
