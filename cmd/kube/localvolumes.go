package main

import (
	"context"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"syscall"

	"plinth.dev/plinth/roleserver/kubernetes/localvolumes"
)

// runLocalVolumes is `kube local-volumes`: the node's local volume
// provisioner (package localvolumes).
func runLocalVolumes(args []string) int {
	fs := flag.NewFlagSet("local-volumes", flag.ContinueOnError)
	kubeconfig := fs.String("kubeconfig", "", "kubeconfig (the provisioner's own identity)")
	node := fs.String("node", "", "this node's name")
	dir := fs.String("dir", "", "where the volumes are mounted, on the data volume")
	images := fs.String("images", "", "where their filesystems' images are kept, on the data volume")
	if err := fs.Parse(args); err != nil || *kubeconfig == "" || *node == "" || *dir == "" || *images == "" {
		fmt.Fprintln(os.Stderr, "usage: kube local-volumes -kubeconfig FILE -node NAME -dir DIR -images DIR")
		return 2
	}
	cs, err := clientset(*kubeconfig)
	if err != nil {
		fmt.Fprintln(os.Stderr, "local-volumes:", err)
		return 1
	}
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, syscall.SIGINT)
	defer stop()
	p := &localvolumes.Provisioner{Client: cs, Node: *node, Dir: *dir, Images: *images, FS: localvolumes.KernelFilesystems,
		Log: func(format string, args ...any) { fmt.Fprintf(os.Stderr, format+"\n", args...) }}
	if err := p.Run(ctx); err != nil && ctx.Err() == nil {
		fmt.Fprintln(os.Stderr, "local-volumes:", err)
		return 1
	}
	return 0
}
