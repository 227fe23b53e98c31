package main

import (
	"context"
	"fmt"
	"os/exec"
	"slices"
	"strings"
	"time"
)

// The cluster's nodes during a run:
//
//	before the first attempt ──► waitNodes: every node Ready (15 min)
//	during an attempt, every nodeEvery ──► nodeWatch.check
//	   a node Ready at the last look and not now (or gone)
//	     ──► the attempt interrupted, its running specs "interrupted"
//	         with the node named in their failure
//	before the next attempt ──► waitNodes (nodeWait): the node back, or
//	   the run goes on without it (its specs fail on their own timeouts)
//
// Why interrupt: a spec whose pods were on a node that lost its power
// waits out its own timeouts (five to fifteen minutes each, four specs
// at a time) and then fails for a reason it does not name. Interrupted,
// it ends at once saying which node went away, and it runs again once
// the node is back (a spec is failed after its second interrupt).

// nodeReady is one node's Ready condition.
type nodeReady struct {
	status, reason, message string // status "True", "False", "Unknown" or "" (no condition yet)
}

func (n nodeReady) String() string {
	s := "Ready=" + n.status
	if n.status == "" {
		s = "no Ready condition"
	}
	if n.reason != "" {
		s += " " + n.reason
	}
	if n.message != "" {
		s += ": " + n.message
	}
	return s
}

// nodeColumns is the kubectl output nodes parses: one line per node,
// tab-separated name, Ready status, reason, message.
const nodeColumns = `jsonpath={range .items[*]}{.metadata.name}{"\t"}` +
	`{.status.conditions[?(@.type=="Ready")].status}{"\t"}` +
	`{.status.conditions[?(@.type=="Ready")].reason}{"\t"}` +
	`{.status.conditions[?(@.type=="Ready")].message}{"\n"}{end}`

// nodes reads every node's Ready condition.
func (c *runCmd) nodes(ctx context.Context, kubeconfig string) (map[string]nodeReady, error) {
	ctx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	out, err := exec.CommandContext(ctx, c.kubectl, "--kubeconfig", kubeconfig, "get", "nodes", "-o", nodeColumns).Output()
	if err != nil {
		if ee, ok := err.(*exec.ExitError); ok {
			return nil, fmt.Errorf("kubectl get nodes: %v: %s", err, tail(ee.Stderr, 3))
		}
		return nil, fmt.Errorf("kubectl get nodes: %w", err)
	}
	m := map[string]nodeReady{}
	for _, l := range strings.Split(strings.TrimSpace(string(out)), "\n") {
		f := strings.SplitN(l, "\t", 4)
		if len(f) < 4 || f[0] == "" {
			continue
		}
		m[f[0]] = nodeReady{status: f[1], reason: f[2], message: f[3]}
	}
	return m, nil
}

// notReady lists the nodes of m that are not Ready, sorted.
func notReady(m map[string]nodeReady) []string {
	var l []string
	for name, n := range m {
		if n.status != "True" {
			l = append(l, name+" "+n.String())
		}
	}
	slices.Sort(l)
	return l
}

// waitNodes waits until at least c.clusterNodes nodes are there and all
// of them Ready, for at most wait; it returns how many were not (the
// nodes missing or not Ready at the last look) with its error.
func (c *runCmd) waitNodes(ctx context.Context, kubeconfig string, wait time.Duration) (notReadyNodes int, err error) {
	deadline := time.Now().Add(wait)
	for {
		m, err := c.nodes(ctx, kubeconfig)
		if err == nil && len(m) >= c.clusterNodes && len(notReady(m)) == 0 {
			names := make([]string, 0, len(m))
			for n := range m {
				names = append(names, n)
			}
			slices.Sort(names)
			fmt.Printf("conformance: nodes ready: %s\n", strings.Join(names, " "))
			return 0, nil
		}
		if time.Now().After(deadline) {
			n := c.clusterNodes
			if err == nil {
				n = len(notReady(m)) + max(0, c.clusterNodes-len(m))
				err = fmt.Errorf("%d of %d nodes there, not ready: %s", len(m), c.clusterNodes, strings.Join(notReady(m), "; "))
			}
			return n, fmt.Errorf("nodes not ready after %v: %w", wait, err)
		}
		select {
		case <-ctx.Done():
			return 0, ctx.Err()
		case <-time.After(c.nodeEvery / 6):
		}
	}
}

// nodeWatch notices a node that stops being Ready during an attempt.
type nodeWatch struct {
	c          *runCmd
	kubeconfig string
	last       time.Time
	ready      map[string]bool // at the last successful look
	failing    bool            // the last look failed (said once)
}

func (c *runCmd) watchNodes(kubeconfig string) *nodeWatch {
	return &nodeWatch{c: c, kubeconfig: kubeconfig}
}

// check looks at the nodes if nodeEvery has passed since the last look.
// It returns why to interrupt, or "": the nodes that were Ready at the
// last look and are not now. A node not Ready at the first look is not
// a reason (it was so before the attempt began), nor is an API server
// that does not answer (a busy one may not: the specs notice if it is
// gone).
func (w *nodeWatch) check(ctx context.Context) string {
	if time.Since(w.last) < w.c.nodeEvery {
		return ""
	}
	w.last = time.Now()
	m, err := w.c.nodes(ctx, w.kubeconfig)
	if err != nil {
		if !w.failing {
			fmt.Printf("conformance: cannot see the nodes: %v\n", err)
		}
		w.failing = true
		return ""
	}
	w.failing = false
	var lost []string
	for name, was := range w.ready {
		n, there := m[name]
		switch {
		case was && !there:
			lost = append(lost, "node "+name+" is gone")
		case was && n.status != "True":
			lost = append(lost, "node "+name+" "+n.String())
		}
	}
	w.ready = map[string]bool{}
	for name, n := range m {
		w.ready[name] = n.status == "True"
	}
	slices.Sort(lost)
	return strings.Join(lost, "; ")
}
