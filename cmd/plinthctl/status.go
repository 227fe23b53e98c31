package main

import (
	"context"
	"fmt"
	"io"
	"strings"
	"text/tabwriter"

	"github.com/spf13/pflag"

	"plinth.dev/plinth/api/clusterpb"
)

func init() {
	add(spec{path: "node status", args: "NODE", short: "Show a node's runnables: state, restarts, CPU and memory of their processes",
		minArgs: 1, maxArgs: 1, formats: readFormats, new: func() command { return new(statusCmd) }})
}

// statusCmd is `plinthctl node status [--all] NODE`.
type statusCmd struct {
	all bool
}

func (c *statusCmd) flags(fs *pflag.FlagSet) {
	fs.BoolVar(&c.all, "all", false, "list every runnable, not only those running a process or in trouble")
}

func (c *statusCmd) run(ctx context.Context, e *env, args []string) error {
	cl, id, err := e.dialNode(ctx, args[0])
	if err != nil {
		return err
	}
	defer cl.Close()
	ctx, cancel := context.WithTimeout(ctx, callTimeout)
	defer cancel()
	resp, err := cl.NodeStatus(ctx, id)
	if err != nil {
		return err
	}
	return e.show(resp, func(w io.Writer) error {
		for _, p := range resp.GetStatus().GetProblems() {
			fmt.Fprintf(w, "problem: %s: %s\n", p.GetComponent(), p.GetMessage())
		}
		return printRunnables(w, resp.GetRunnables(), c.all)
	})
}

// printRunnables is the status table: runnables with a process, restarts
// or an error (all of them with all), with the process's CPU time and
// memory.
func printRunnables(w io.Writer, rs []*clusterpb.RunnableStatus, all bool) error {
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "RUNNABLE\tSTATE\tRESTARTS\tPID\tCPU\tRSS\tPEAK RSS\tLAST ERROR")
	for _, r := range rs {
		p := r.GetProcess()
		if !all && p == nil && r.GetRestarts() == 0 && r.GetLastError() == "" {
			continue
		}
		pid, cpu, rss, peak := "-", "-", "-", "-"
		if p != nil {
			pid = fmt.Sprint(p.GetPid())
			cpu = fmt.Sprintf("%.1fs", p.GetCpuSeconds())
			rss, peak = mebibytes(p.GetRssBytes()), mebibytes(p.GetPeakRssBytes())
		}
		lastErr := r.GetLastError()
		if len(lastErr) > 60 {
			lastErr = lastErr[:57] + "..."
		}
		fmt.Fprintf(tw, "%s\t%s\t%d\t%s\t%s\t%s\t%s\t%s\n", r.GetDn(), r.GetState(), r.GetRestarts(), pid, cpu, rss, peak,
			orDash(strings.ReplaceAll(lastErr, "\n", " ")))
	}
	return tw.Flush()
}

func mebibytes(b uint64) string { return fmt.Sprintf("%.1fMiB", float64(b)/(1<<20)) }
