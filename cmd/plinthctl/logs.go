package main

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"

	"github.com/spf13/pflag"
	"google.golang.org/protobuf/encoding/protojson"
	"sigs.k8s.io/yaml"

	"plinth.dev/plinth/api/clusterpb"
)

func init() {
	add(spec{path: "node logs", args: "NODE", short: "Print a node's logs (-f to follow)",
		long: "Print NODE's log entries, through its NodeManagement service.\n\n" +
			"-o text (the default) prints a line per entry as the node's console does; -o json\n" +
			"prints one JSON object per entry and line (JSON Lines), so that a --follow stream\n" +
			"stays parseable line by line; -o yaml prints one document per entry, each after \"---\".\n\n" +
			"--audit reads the Kubernetes API server's audit log instead (the node must be a\n" +
			"Kubernetes controller): its entries are JSON events already, printed as they are\n" +
			"for text and json; yaml is refused.",
		minArgs: 1, maxArgs: 1, formats: textFormats, new: func() command { return new(logsCmd) }})
}

// logsCmd is `plinthctl node logs [-f] [--dn DN] [-n N] [--audit] NODE`.
// --audit reads the API server's audit log: a stream of its own in the
// node's log tree (one JSON event per entry), which the rest of the logs
// do not include.
type logsCmd struct {
	follow    bool
	dn        string
	recursive bool
	tail      int64
	audit     bool
}

// auditDN is the stream of the API server's audit events in a controller
// node's log tree: roleserver/kubernetes.AuditStream below the API
// server's runnable (TestKubernetesTwoNodes reads it).
const auditDN = "root.roleserver.kubernetes.controller.apiserver.audit"

func (c *logsCmd) flags(fs *pflag.FlagSet) {
	fs.BoolVarP(&c.follow, "follow", "f", false, "keep printing new entries (until interrupted)")
	fs.StringVar(&c.dn, "dn", "", "log tree `DN` to read (default the root)")
	fs.BoolVarP(&c.recursive, "recursive", "r", true, "include every DN below --dn (--recursive=false: that DN alone)")
	fs.Int64VarP(&c.tail, "tail", "n", -1, "print the last `N` past entries first (-1 all, 0 none)")
	fs.BoolVar(&c.audit, "audit", false, "the API server's audit log (one JSON event per line) instead: the node must be a Kubernetes controller")
}

func (c *logsCmd) run(ctx context.Context, e *env, args []string) error {
	if c.audit {
		switch {
		case c.dn != "":
			return usagef("give --audit or --dn, not both: --audit is the log tree DN %s", auditDN)
		case e.output == "yaml":
			return usagef("-o yaml: --audit entries are JSON events already; print them with -o text or -o json")
		}
		c.dn = auditDN
	}
	cl, id, err := e.dialNode(ctx, args[0])
	if err != nil {
		return err
	}
	defer cl.Close()
	if !c.follow {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, 2*callTimeout)
		defer cancel()
	}
	err = cl.Logs(ctx, id, &clusterpb.LogsRequest{Dn: c.dn, Recursive: c.recursive, Backlog: c.tail, Follow: c.follow}, c.printer(e))
	if c.follow && ctx.Err() != nil {
		return nil // Ctrl-C ends --follow
	}
	return err
}

// printer is what prints one entry in the -o format. Each entry is
// printed whole as it arrives, so that a follow stream can be read (and
// parsed) while it goes on.
func (c *logsCmd) printer(e *env) func(*clusterpb.LogEntry) error {
	w := e.stdout
	switch {
	case c.audit:
		// The event, as the API server wrote it: a JSON object.
		return func(le *clusterpb.LogEntry) error { return writeLine(w, le.GetMessage()) }
	case e.output == "json":
		return func(le *clusterpb.LogEntry) error {
			b, err := compactJSON(le)
			if err != nil {
				return err
			}
			return writeLine(w, string(b))
		}
	case e.output == "yaml":
		return func(le *clusterpb.LogEntry) error {
			b, err := compactJSON(le)
			if err == nil {
				b, err = yaml.JSONToYAML(b)
			}
			if err != nil {
				return err
			}
			_, err = fmt.Fprintf(w, "---\n%s", b)
			return err
		}
	}
	return func(le *clusterpb.LogEntry) error { return writeLine(w, formatLogEntry(le)) }
}

// compactJSON is le in protojson's encoding on one line.
func compactJSON(le *clusterpb.LogEntry) ([]byte, error) {
	b, err := protojson.Marshal(le)
	if err != nil {
		return nil, err
	}
	var out bytes.Buffer
	err = json.Compact(&out, b)
	return out.Bytes(), err
}

func writeLine(w io.Writer, line string) error {
	_, err := fmt.Fprintln(w, line)
	return err
}
