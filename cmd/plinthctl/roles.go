package main

import (
	"context"
	"errors"
	"fmt"
	"io"

	"google.golang.org/protobuf/proto"

	"plinth.dev/plinth/api/clusterpb"
)

func init() {
	register("roles", "roles add|remove NODE consensus-member|kubernetes-controller|kubernetes-worker...", func() verb { return new(rolesCmd) })
}

// rolesCmd is `plinthctl roles add|remove NODE ROLE...`.
type rolesCmd struct {
	config string
}

func (c *rolesCmd) run(ctx context.Context, args []string, _, stderr io.Writer) error {
	fs := newFlagSet("roles", stderr)
	configFlagVar(fs, &c.config)
	pos, err := parseArgs(fs, args)
	if err != nil {
		return err
	}
	if len(pos) < 3 || (pos[0] != "add" && pos[0] != "remove") {
		return errors.New("usage: plinthctl roles add|remove NODE consensus-member|kubernetes-controller|kubernetes-worker...")
	}
	on := pos[0] == "add"
	cl, ctx, done, err := ownerCall(ctx, c.config)
	if err != nil {
		return err
	}
	defer done()
	n, err := cl.FindNode(ctx, pos[1])
	if err != nil {
		return err
	}
	req := &clusterpb.UpdateNodeRolesRequest{Node: &clusterpb.UpdateNodeRolesRequest_Id{Id: n.GetId()}}
	for _, r := range pos[2:] {
		switch r {
		case "consensus-member", "consensus":
			req.ConsensusMember = proto.Bool(on)
		case "kubernetes-controller", "controller":
			req.KubernetesController = proto.Bool(on)
		case "kubernetes-worker", "worker":
			req.KubernetesWorker = proto.Bool(on)
		default:
			return fmt.Errorf("unknown role %q: want consensus-member, kubernetes-controller or kubernetes-worker", r)
		}
	}
	if err := cl.UpdateRoles(ctx, req); err != nil {
		return err
	}
	fmt.Fprintf(stderr, "plinthctl: %s: roles updated\n", n.GetId())
	return nil
}
