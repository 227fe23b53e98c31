package main

import (
	"context"
	"fmt"
	"io"

	"plinth.dev/plinth/api/clusterpb"
)

func init() {
	register("logs", "print a node's logs (-f to follow)", func() verb { return new(logsCmd) })
}

// logsCmd is `plinthctl logs [-f] [-dn DN] [-n N] NODE`, through the
// node's NodeManagement service.
type logsCmd struct {
	config    string
	follow    bool
	dn        string
	recursive bool
	backlog   int64
}

func (c *logsCmd) run(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs := newFlagSet("logs", stderr)
	configFlagVar(fs, &c.config)
	fs.BoolVar(&c.follow, "f", false, "keep printing new entries")
	fs.StringVar(&c.dn, "dn", "", "log tree `DN` to read (default the root)")
	fs.BoolVar(&c.recursive, "r", true, "include every DN below -dn")
	fs.Int64Var(&c.backlog, "n", -1, "past entries to print first (-1 all, 0 none)")
	cl, id, err := dialForNode(ctx, fs, args, &c.config, "usage: plinthctl logs [-f] [-dn DN] [-n N] NODE")
	if err != nil {
		return err
	}
	defer cl.Close()
	if !c.follow {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, 2*callTimeout)
		defer cancel()
	}
	err = cl.Logs(ctx, id, &clusterpb.LogsRequest{Dn: c.dn, Recursive: c.recursive, Backlog: c.backlog, Follow: c.follow},
		func(e *clusterpb.LogEntry) error {
			_, err := fmt.Fprintln(stdout, formatLogEntry(e))
			return err
		})
	if c.follow && ctx.Err() != nil {
		return nil // Ctrl-C ends -f
	}
	return err
}
