package main

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"sync"
	"text/tabwriter"
	"time"

	"github.com/spf13/pflag"

	"plinth.dev/plinth/board"
	"plinth.dev/plinth/launch"
	"plinth.dev/plinth/roleserver/owner"
)

func init() {
	add(spec{path: "launch", short: "Launch a local test cluster of N nodes in QEMU", group: groupImage,
		long: "Launch a local test cluster in QEMU (package launch): the first node bootstraps it,\n" +
			"the others join; the owner configuration is DIR/owner. plinthctl prints how to reach\n" +
			"the cluster and keeps it running until Ctrl-C, which powers every node off.",
		maxArgs: 0, new: func() command { return new(launchCmd) }})
}

// launchCmd is `plinthctl launch`: it starts a cluster, prints how to
// reach it and keeps it running until Ctrl-C, which powers every node off.
type launchCmd struct {
	nodes    int
	image    string
	dir      string
	fresh    bool
	consoles bool
	// noKubernetes: the nodes run no Kubernetes (the first one is a
	// controller and worker, the others workers, by default).
	noKubernetes bool
}

func (c *launchCmd) flags(fs *pflag.FlagSet) {
	fs.IntVar(&c.nodes, "nodes", 1, "`number` of nodes (the first bootstraps the cluster)")
	fs.BoolVar(&c.noKubernetes, "no-kubernetes", false, "run no Kubernetes (by default the first node is a Kubernetes controller and worker, the others workers)")
	fs.StringVar(&c.image, "image", "", "image `directory` (plinthctl build --out; default OUT/image/"+board.Default+", "+outHelp+")")
	fs.StringVar(&c.dir, "dir", "", "`directory` for the nodes' disks, TPM state and logs, and the owner configuration (DIR/owner; default OUT/cluster)")
	fs.BoolVar(&c.fresh, "fresh", false, "delete DIR first if it holds an earlier cluster")
	fs.BoolVar(&c.consoles, "console", false, "copy every node's console to stderr, prefixed with its name")
}

func (c *launchCmd) run(ctx context.Context, e *env, _ []string) error {
	stderr := e.stderr
	if c.nodes < 1 {
		return usagef("--nodes %d: want at least 1", c.nodes)
	}
	if c.image == "" {
		c.image = filepath.Join(outDir(), "image", board.Default)
	}
	if c.dir == "" {
		c.dir = filepath.Join(outDir(), "cluster")
	}
	img, err := launch.LoadImage(c.image)
	if err != nil {
		return err
	}
	if entries, err := os.ReadDir(c.dir); err == nil && len(entries) > 0 {
		if !c.fresh {
			return fmt.Errorf("%s is not empty (an earlier cluster?): remove it or pass --fresh", c.dir)
		}
		if err := os.RemoveAll(c.dir); err != nil {
			return err
		}
	}
	o := launch.ClusterOptions{Nodes: c.nodes, Image: img, Dir: c.dir, Progress: stderr, DiskSizeBytes: 4 << 30, Kubernetes: !c.noKubernetes}
	if c.consoles {
		var mu sync.Mutex
		o.Console = func(name string) io.Writer { return &prefixWriter{mu: &mu, w: stderr, prefix: name + "| "} }
	}
	fmt.Fprintf(stderr, "plinthctl: launching %d node(s) (%s acceleration); this takes minutes under TCG\n", c.nodes, accel())
	cl, err := launch.LaunchCluster(ctx, o)
	if err != nil {
		return err
	}
	defer cl.Close()

	tw := tabwriter.NewWriter(stderr, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "NAME\tID\tADDRESS\tCURATOR\tNODE MANAGEMENT\tCONSOLE")
	for _, n := range cl.Nodes() {
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\n", n.Name, n.ID(), n.Addr, cl.CuratorEndpoint(n), cl.NodeManagementEndpoint(n),
			filepath.Join(n.Dir, "boot*", "console.log"))
	}
	tw.Flush()
	fmt.Fprintf(stderr, "\nplinthctl: the cluster is up. In another shell:\n")
	self := selfCommand()
	for _, cmd := range cl.OwnerCommands(self, projectKubectl(self)) {
		fmt.Fprintf(stderr, "  %s\n", cmd)
	}
	fmt.Fprintf(stderr, "Ctrl-C powers the nodes off.\n")
	if !c.noKubernetes && c.nodes > 1 {
		// Pods belong on the workers, not next to etcd and the API server.
		go taintConsensusMembers(ctx, cl, stderr)
	}

	<-ctx.Done()
	fmt.Fprintln(stderr, "\nplinthctl: powering the nodes off")
	var wg sync.WaitGroup
	for _, n := range cl.Nodes() {
		wg.Add(1)
		go func() {
			defer wg.Done()
			sctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
			defer cancel()
			if err := cl.StopNode(sctx, n, time.Minute); err != nil {
				fmt.Fprintf(stderr, "plinthctl: %s: %v\n", n.Name, err)
			}
		}()
	}
	wg.Wait()
	return nil
}

// prefixWriter prefixes each line with a node's name; lines of several
// nodes interleave whole.
type prefixWriter struct {
	mu     *sync.Mutex
	w      io.Writer
	prefix string
	buf    []byte
}

func (p *prefixWriter) Write(b []byte) (int, error) {
	p.buf = append(p.buf, b...)
	for {
		i := bytes.IndexByte(p.buf, '\n')
		if i < 0 {
			return len(b), nil
		}
		p.mu.Lock()
		_, err := fmt.Fprintf(p.w, "%s%s\n", p.prefix, bytes.TrimRight(p.buf[:i], "\r"))
		p.mu.Unlock()
		p.buf = p.buf[i+1:]
		if err != nil {
			return len(b), err
		}
	}
}

// taintConsensusMembers puts the control plane taint on the cluster's
// consensus members (the bootstrap node) once their Kubernetes nodes
// exist, so that pods go to the other workers.
func taintConsensusMembers(ctx context.Context, cl *launch.Cluster, stderr io.Writer) {
	n := cl.Nodes()[0]
	for ctx.Err() == nil {
		actx, cancel := context.WithTimeout(ctx, time.Minute)
		api, err := cl.Client().KubeAPI(actx, cl.KubernetesAPIEndpoint(n))
		if err == nil {
			err = api.Taint(actx, n.ID(), true)
		}
		cancel()
		if err == nil {
			fmt.Fprintf(stderr, "plinthctl: %s (%s, the consensus member) tainted %s:NoSchedule: pods run on the other workers (plinthctl role untaint %s undoes it)\n",
				n.Name, n.ID(), owner.ControlPlaneTaint, n.ID())
			return
		}
		select {
		case <-ctx.Done():
		case <-time.After(5 * time.Second):
		}
	}
}
