// Command plinthctl builds Plinth images and operates Plinth nodes.
//
//	plinthctl build  [-board B] -kernel-package DEB -init BIN [-out DIR]
//	plinthctl run    [-image DIR] [-state DIR]      boot one node in QEMU with swtpm
//	plinthctl params -o FILE -bootstrap|-register   write node parameters
//	plinthctl launch [-nodes N] [-dir DIR]          local test cluster (vmtest)
//
// Cluster commands (as its owner; -config DIR, default $PLINTH_CONFIG or
// ~/.config/plinth):
//
//	plinthctl takeownership -endpoint HOST:PORT [-owner-key FILE]
//	plinthctl nodes list|describe [-o json] [NODE]
//	plinthctl approve [PUBKEY|NODE...]
//	plinthctl roles add|remove NODE ROLE...
//	plinthctl ticket
//	plinthctl logs [-f] NODE
//	plinthctl reboot NODE
package main

import (
	"context"
	"fmt"
	"os"
	"os/signal"
	"sort"
	"syscall"
)

type command struct {
	summary string
	run     func(ctx context.Context, args []string) error
}

var commands = map[string]command{}

func main() {
	if len(os.Args) < 2 || commands[os.Args[1]].run == nil {
		usage()
		os.Exit(2)
	}
	ctx, cancel := signalContext()
	defer cancel()
	if err := commands[os.Args[1]].run(ctx, os.Args[2:]); err != nil {
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
