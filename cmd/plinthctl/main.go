// Command plinthctl builds Plinth images and operates Plinth nodes.
//
// Images and machines:
//
//	plinthctl build  [-board B] [-kernel-package DEB] -init BIN -bin DIR [-out DIR] [-sign-key KEY -release N]
//	plinthctl fetch-kernel [-board B] [-cache DIR]  the board's Debian kernel package into the cache
//	plinthctl release-key -o FILE                   a release key (FILE, FILE.pub) that signs images
//	plinthctl params -o FILE -bootstrap|-register   write node parameters
//	plinthctl write-disk -image DIR -params FILE -device DEV   flash a disk (or a file)
//	plinthctl run    [-image DIR] [-state DIR]      boot one node in QEMU with swtpm
//	plinthctl launch [-nodes N] [-dir DIR]          local test cluster (vmtest)
//
// Cluster commands (as its owner; -config DIR, default $PLINTH_CONFIG or
// ~/.config/plinth):
//
//	plinthctl takeownership -endpoint HOST:PORT [-owner-key FILE] [-ca-fingerprint HEX]
//	plinthctl nodes list|describe [-o json] [NODE]
//	plinthctl approve [PUBKEY|NODE...]
//	plinthctl roles add|remove NODE ROLE...
//	plinthctl roles taint|untaint NODE
//	plinthctl ticket [-rotate]
//	plinthctl status [-all] NODE
//	plinthctl logs [-f] [-audit] NODE
//	plinthctl reboot NODE
//	plinthctl update -image DIR NODE|-all [-stage|-activate|-cancel|-no-reboot]
//	plinthctl decommission -yes NODE
//	plinthctl policy [-pod-security LEVEL] [-allow-host-path P] [-allow-external-ips CIDR]
//	                 [-add-release-key KEY] [-remove-release-key KEY] [-sign-key KEY]...
//	plinthctl owner-key -rotate|-encrypt|-decrypt
//	plinthctl secrets-key status|rotate
//	plinthctl kubeconfig [-server https://HOST:PORT] [-wait D] [-revoke-all] [-o FILE]
//	plinthctl kubernetes-credential        kubectl's credential plugin (ExecCredential)
//
// Each verb is one file: a struct holding its flags, with a run method
// that parses them and does the work (the layout of gokrazy's tools).
// Helpers shared by several verbs live in their own small files: flags.go
// (flag parsing), ownerconn.go (owner configuration and connections) and
// output.go (how nodes and log entries are printed).
package main

import (
	"context"
	"fmt"
	"io"
	"os"
	"os/signal"
	"sort"
	"syscall"
)

// verb is one plinthctl command. run parses args into the verb's flags
// and runs it; a verb writes only to stdout and stderr, so that tests can
// run it as main does.
type verb interface {
	run(ctx context.Context, args []string, stdout, stderr io.Writer) error
}

type command struct {
	summary string
	new     func() verb
}

var commands = map[string]command{}

// register adds a verb; each verb's file calls it from init.
func register(name, summary string, new func() verb) {
	commands[name] = command{summary: summary, new: new}
}

func main() {
	if len(os.Args) < 2 || commands[os.Args[1]].new == nil {
		usage()
		os.Exit(2)
	}
	ctx, cancel := signalContext()
	defer cancel()
	if err := commands[os.Args[1]].new().run(ctx, os.Args[2:], os.Stdout, os.Stderr); err != nil {
		fmt.Fprintf(os.Stderr, "plinthctl %s: %v\n", os.Args[1], err)
		os.Exit(1)
	}
}

func signalContext() (context.Context, context.CancelFunc) {
	return signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
}

func usage() {
	fmt.Fprintln(os.Stderr, "usage: plinthctl COMMAND [flags]\n\ncommands:")
	var names []string
	for n := range commands {
		names = append(names, n)
	}
	sort.Strings(names)
	for _, n := range names {
		fmt.Fprintf(os.Stderr, "  %-14s %s\n", n, commands[n].summary)
	}
}
