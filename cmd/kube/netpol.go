package main

import (
	"context"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"syscall"

	"sigs.k8s.io/knftables"

	"plinth.dev/plinth/roleserver/kubernetes/netpol"
)

// runNetworkPolicies is `kube network-policies`: NetworkPolicy enforced
// for this node's pods (package netpol).
func runNetworkPolicies(args []string) int {
	fs := flag.NewFlagSet("network-policies", flag.ContinueOnError)
	kubeconfig := fs.String("kubeconfig", "", "kubeconfig")
	node := fs.String("node", "", "this node's name")
	if err := fs.Parse(args); err != nil || *kubeconfig == "" || *node == "" {
		fmt.Fprintln(os.Stderr, "usage: kube network-policies -kubeconfig FILE -node NAME")
		return 2
	}
	fail := func(err error) int {
		fmt.Fprintln(os.Stderr, "network-policies:", err)
		return 1
	}
	cs, err := clientset(*kubeconfig)
	if err != nil {
		return fail(err)
	}
	nft, err := knftables.New(knftables.InetFamily, netpol.Table)
	if err != nil {
		return fail(err)
	}
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, syscall.SIGINT)
	defer stop()
	c := &netpol.Controller{Client: cs, Node: *node, NFT: nft, Log: func(format string, args ...any) { fmt.Fprintf(os.Stderr, format+"\n", args...) }}
	if err := c.Run(ctx); err != nil && ctx.Err() == nil {
		return fail(err)
	}
	return 0
}
