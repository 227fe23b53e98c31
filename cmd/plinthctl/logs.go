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

// logsCmd is `plinthctl logs [-f] [-dn DN] [-n N] [-audit] NODE`,
// through the node's NodeManagement service. -audit reads the API
// server's audit log: a stream of its own in the node's log tree (one
// JSON event per entry), which the rest of the logs do not include.
type logsCmd struct {
	config    string
	follow    bool
	dn        string
	recursive bool
	backlog   int64
	audit     bool
}

// auditDN is the stream of the API server's audit events in a controller
// node's log tree: roleserver/kubernetes.AuditStream below the API
// server's runnable (TestKubernetesTwoNodes reads it).
const auditDN = "root.roleserver.kubernetes.controller.apiserver.audit"

func (c *logsCmd) run(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs := newFlagSet("logs", stderr)
	configFlagVar(fs, &c.config)
	fs.BoolVar(&c.follow, "f", false, "keep printing new entries")
	fs.StringVar(&c.dn, "dn", "", "log tree `DN` to read (default the root)")
	fs.BoolVar(&c.recursive, "r", true, "include every DN below -dn")
	fs.Int64Var(&c.backlog, "n", -1, "past entries to print first (-1 all, 0 none)")
	fs.BoolVar(&c.audit, "audit", false, "the API server's audit log (one JSON event per line) instead: the node must be a Kubernetes controller")
	cl, id, err := dialForNode(ctx, fs, args, &c.config, "usage: plinthctl logs [-f] [-dn DN] [-n N] [-audit] NODE")
	if err != nil {
		return err
	}
	if c.audit {
		if c.dn != "" {
			return fmt.Errorf("give -audit or -dn, not both")
		}
		c.dn = auditDN
	}
	defer cl.Close()
	if !c.follow {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, 2*callTimeout)
		defer cancel()
	}
	err = cl.Logs(ctx, id, &clusterpb.LogsRequest{Dn: c.dn, Recursive: c.recursive, Backlog: c.backlog, Follow: c.follow},
		func(e *clusterpb.LogEntry) error {
			line := formatLogEntry(e)
			if c.audit {
				line = e.GetMessage() // the event, as the API server wrote it
			}
			_, err := fmt.Fprintln(stdout, line)
			return err
		})
	if c.follow && ctx.Err() != nil {
		return nil // Ctrl-C ends -f
	}
	return err
}
