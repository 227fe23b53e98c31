// Command plinthctl builds Plinth images and operates Plinth clusters.
//
// Cluster commands, as the cluster's owner (--config DIR, default
// $PLINTH_CONFIG or ~/.config/plinth; --endpoint HOST:PORT; -o json|yaml
// on every command that prints objects):
//
//	plinthctl node list|describe|approve|status|logs|reboot|poweroff|decommission|update
//	plinthctl role add|remove|taint|untaint
//	plinthctl cluster takeownership|policy|ticket|kubeconfig|owner-key|secrets-key|update
//	plinthctl release key
//
// Images and machines:
//
//	plinthctl build|run|launch|write-disk|params|fetch-kernel
//
// Other commands:
//
//	plinthctl version|completion
//
// and the hidden kubernetes-credential, kubectl's credential plugin.
// docs/reference/cli.md is generated from the tree (TestCLIReference).
//
// Each command is one file: a struct holding its flags, a flags method
// that declares them and a run method that does the work (the layout of
// gokrazy's tools); cli.go builds the cobra tree from their specs.
// Helpers shared by several commands live in their own small files:
// ownerconn.go (owner configuration and connections), format.go (-o) and
// output.go (how nodes and log entries are printed).
package main

import (
	"context"
	"os"
	"os/signal"
	"syscall"
)

func main() {
	ctx, cancel := signalContext()
	code := execute(ctx, os.Args[1:], os.Stdout, os.Stderr)
	cancel()
	os.Exit(code)
}

func signalContext() (context.Context, context.CancelFunc) {
	return signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
}
