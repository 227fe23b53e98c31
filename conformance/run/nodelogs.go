package main

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"time"
)

// A node of the launched cluster, as saveNodeLogs reads it.
type nodeRef struct {
	name, id string
}

// nodeLogsTimeout bounds the reading of one node's logs: a node whose
// power was cut does not answer, and the others are still read.
var nodeLogsTimeout = 3 * time.Minute

// saveNodeLogs writes every node's log tree (`plinthctl node logs`: each
// component, as much of it as the node keeps) to dir/NAME.log before the
// cluster is powered off. The suite keeps the logs of a failed spec's
// pods but not of what ran them, and a failure that a node's kube-proxy,
// kubelet or containerd explains (a connection refused at a Service
// address, a sandbox that did not start) can then be looked into after
// the run. A node that cannot be read, or not wholly, has the reason at
// the end of its file.
func (c *runCmd) saveNodeLogs(ownerDir string, nodes []nodeRef, dir string) {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		fmt.Printf("conformance: node logs: %v\n", err)
		return
	}
	for _, n := range nodes {
		file := filepath.Join(dir, n.name+".log")
		if err := c.nodeLogs(ownerDir, n.id, file); err != nil {
			fmt.Printf("conformance: the logs of %s: %v\n", n.name, err)
		}
	}
	fmt.Printf("conformance: the nodes' logs are in %s\n", dir)
}

// nodeLogs writes node id's logs to file, and why they end early, if
// they do, after what was read.
func (c *runCmd) nodeLogs(ownerDir, id, file string) (err error) {
	ctx, cancel := context.WithTimeout(context.Background(), nodeLogsTimeout)
	defer cancel()
	f, err := os.Create(file)
	if err != nil {
		return err
	}
	defer func() {
		if err != nil {
			fmt.Fprintf(f, "conformance: plinthctl node logs %s: %v\n", id, err)
		}
		if cerr := f.Close(); err == nil {
			err = cerr
		}
	}()
	cmd := exec.CommandContext(ctx, c.plinthctl, "node", "logs", "--config", ownerDir, id)
	cmd.Stdout = f
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	if err := cmd.Run(); ctx.Err() != nil {
		return fmt.Errorf("no answer within %v", nodeLogsTimeout)
	} else if err != nil {
		return fmt.Errorf("%w: %s", err, bytes.TrimSpace(stderr.Bytes()))
	}
	return nil
}

// saveMetrics writes the API server's metrics to dir/apiserver.metrics
// and each node's kubelet's (through the API server's node proxy) to
// dir/NAME.kubelet.metrics before the cluster is powered off: where a
// run's time went, for a spec that failed on time alone (the kubelet's
// pod status sync durations, the API server's request durations by verb
// and resource, its priority and fairness queue waits). A source that
// does not answer has the reason in its file.
func (c *runCmd) saveMetrics(kubeconfig string, nodes []nodeRef, dir string) {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		fmt.Printf("conformance: metrics: %v\n", err)
		return
	}
	sources := map[string]string{"apiserver.metrics": "/metrics"}
	for _, n := range nodes {
		sources[n.name+".kubelet.metrics"] = "/api/v1/nodes/" + n.id + "/proxy/metrics"
	}
	for file, path := range sources {
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		out, err := exec.CommandContext(ctx, c.kubectl, "--kubeconfig", kubeconfig, "get", "--raw", path).Output()
		cancel()
		if err != nil {
			out = fmt.Appendf(out, "conformance: kubectl get --raw %s: %v\n", path, err)
		}
		if err := os.WriteFile(filepath.Join(dir, file), out, 0o644); err != nil {
			fmt.Printf("conformance: metrics: %v\n", err)
		}
	}
	fmt.Printf("conformance: the API server's and the kubelets' metrics are in %s\n", dir)
}
