package main

import (
	"context"
	"errors"
	"fmt"
	"io"

	"google.golang.org/protobuf/proto"

	"plinth.dev/plinth/api/clusterpb"
	"plinth.dev/plinth/roleserver/owner"
)

func init() {
	register("roles", "roles add|remove NODE consensus-member|kubernetes-controller|kubernetes-worker..., roles taint|untaint NODE", func() verb { return new(rolesCmd) })
}

// rolesCmd is `plinthctl roles add|remove NODE ROLE...`, and `plinthctl
// roles taint|untaint NODE`, which puts the NoSchedule control plane
// taint on a controller that is also a worker (or takes it away):
// Kubernetes then schedules pods that do not tolerate it elsewhere.
type rolesCmd struct {
	config     string
	kubeServer string
}

func (c *rolesCmd) run(ctx context.Context, args []string, _, stderr io.Writer) error {
	fs := newFlagSet("roles", stderr)
	configFlagVar(fs, &c.config)
	fs.StringVar(&c.kubeServer, "kube-server", "", "Kubernetes API server `host:port` for taint/untaint (default: the first the cluster names)")
	pos, err := parseArgs(fs, args)
	if err != nil {
		return err
	}
	if len(pos) == 2 && (pos[0] == "taint" || pos[0] == "untaint") {
		return c.taint(ctx, pos[1], pos[0] == "taint", stderr)
	}
	if len(pos) < 3 || (pos[0] != "add" && pos[0] != "remove") {
		return errors.New("usage: plinthctl roles add|remove NODE consensus-member|kubernetes-controller|kubernetes-worker..., or roles taint|untaint NODE")
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

// taint puts the control plane taint on node's Kubernetes node, or takes
// it away.
func (c *rolesCmd) taint(ctx context.Context, ref string, on bool, stderr io.Writer) error {
	cl, ctx, done, err := ownerCall(ctx, c.config)
	if err != nil {
		return err
	}
	defer done()
	n, err := cl.FindNode(ctx, ref)
	if err != nil {
		return err
	}
	api, err := cl.KubeAPI(ctx, c.kubeServer)
	if err != nil {
		return err
	}
	if err := api.Taint(ctx, n.GetId(), on); err != nil {
		return err
	}
	if on {
		fmt.Fprintf(stderr, "plinthctl: %s: tainted %s:NoSchedule (pods that do not tolerate it go elsewhere)\n", n.GetId(), owner.ControlPlaneTaint)
	} else {
		fmt.Fprintf(stderr, "plinthctl: %s: %s taint removed\n", n.GetId(), owner.ControlPlaneTaint)
	}
	return nil
}
