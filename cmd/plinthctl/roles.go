package main

import (
	"context"
	"fmt"

	"github.com/spf13/pflag"
	"google.golang.org/protobuf/proto"

	"plinth.dev/plinth/api/clusterpb"
	"plinth.dev/plinth/roleserver/owner"
)

func init() {
	const roleArgs = "NODE ROLE..."
	const roleLong = "ROLE is consensus-member, kubernetes-controller or kubernetes-worker."
	add(spec{path: "role add", args: roleArgs, short: "Give a node roles", long: "Give NODE each ROLE. " + roleLong,
		minArgs: 2, maxArgs: -1, new: func() command { return &roleCmd{on: true} }})
	add(spec{path: "role remove", args: roleArgs, short: "Take roles away from a node", long: "Take each ROLE away from NODE. " + roleLong,
		minArgs: 2, maxArgs: -1, new: func() command { return &roleCmd{on: false} }})
	add(spec{path: "role taint", args: "NODE", short: "Keep pods off a controller that is also a worker (the control plane taint)",
		long: "Put the NoSchedule control plane taint on NODE's Kubernetes node: pods that do not\n" +
			"tolerate it are scheduled on other workers.",
		minArgs: 1, maxArgs: 1, new: func() command { return &taintCmd{on: true} }})
	add(spec{path: "role untaint", args: "NODE", short: "Take the control plane taint away from a node",
		minArgs: 1, maxArgs: 1, new: func() command { return &taintCmd{on: false} }})
}

// roleCmd is `plinthctl role add NODE ROLE...` (on) and `plinthctl role
// remove NODE ROLE...`.
type roleCmd struct {
	on bool
}

func (c *roleCmd) flags(*pflag.FlagSet) {}

func (c *roleCmd) run(ctx context.Context, e *env, args []string) error {
	req := &clusterpb.UpdateNodeRolesRequest{}
	for _, r := range args[1:] {
		switch r {
		case "consensus-member", "consensus":
			req.ConsensusMember = proto.Bool(c.on)
		case "kubernetes-controller", "controller":
			req.KubernetesController = proto.Bool(c.on)
		case "kubernetes-worker", "worker":
			req.KubernetesWorker = proto.Bool(c.on)
		default:
			return usagef("unknown role %q: want consensus-member, kubernetes-controller or kubernetes-worker", r)
		}
	}
	cl, ctx, done, err := e.call(ctx)
	if err != nil {
		return err
	}
	defer done()
	n, err := cl.FindNode(ctx, args[0])
	if err != nil {
		return err
	}
	req.Node = &clusterpb.UpdateNodeRolesRequest_Id{Id: n.GetId()}
	if err := cl.UpdateRoles(ctx, req); err != nil {
		return err
	}
	fmt.Fprintf(e.stderr, "plinthctl: %s: roles updated\n", n.GetId())
	return nil
}

// taintCmd is `plinthctl role taint NODE` (on) and `plinthctl role
// untaint NODE`: the NoSchedule control plane taint on a controller that
// is also a worker, through the Kubernetes API.
type taintCmd struct {
	on         bool
	kubeServer string
}

func (c *taintCmd) flags(fs *pflag.FlagSet) {
	fs.StringVar(&c.kubeServer, "kube-server", "", "Kubernetes API server `host:port` (default: the first the cluster names)")
}

func (c *taintCmd) run(ctx context.Context, e *env, args []string) error {
	cl, ctx, done, err := e.call(ctx)
	if err != nil {
		return err
	}
	defer done()
	n, err := cl.FindNode(ctx, args[0])
	if err != nil {
		return err
	}
	api, err := cl.KubeAPI(ctx, c.kubeServer)
	if err != nil {
		return err
	}
	if err := api.Taint(ctx, n.GetId(), c.on); err != nil {
		return err
	}
	if c.on {
		fmt.Fprintf(e.stderr, "plinthctl: %s: tainted %s:NoSchedule (pods that do not tolerate it go elsewhere)\n", n.GetId(), owner.ControlPlaneTaint)
	} else {
		fmt.Fprintf(e.stderr, "plinthctl: %s: %s taint removed\n", n.GetId(), owner.ControlPlaneTaint)
	}
	return nil
}
