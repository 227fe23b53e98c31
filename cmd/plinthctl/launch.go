package main

import (
	"bytes"
	"context"
	"flag"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"sync"
	"text/tabwriter"
	"time"

	"plinth.dev/plinth/board"
	"plinth.dev/plinth/vmtest"
)

func init() {
	commands["launch"] = command{"launch a local test cluster of N nodes in QEMU (vmtest)", runLaunch}
}

// runLaunch starts a cluster, prints how to reach it and keeps it running
// until Ctrl-C, which powers every node off.
func runLaunch(ctx context.Context, args []string) error {
	fs := flag.NewFlagSet("launch", flag.ExitOnError)
	nodes := fs.Int("nodes", 1, "number of nodes (the first bootstraps the cluster)")
	imageDir := fs.String("image", "out/image/"+board.Default, "image directory (plinthctl build -out)")
	dir := fs.String("dir", "out/cluster", "directory for the nodes' disks, TPM state and logs, and the owner configuration (DIR/owner)")
	fresh := fs.Bool("fresh", false, "delete DIR first if it holds an earlier cluster")
	consoles := fs.Bool("console", false, "copy every node's console to stderr, prefixed with its name")
	if err := noArgs(fs, args); err != nil {
		return err
	}
	img, err := vmtest.LoadImage(*imageDir)
	if err != nil {
		return err
	}
	if entries, err := os.ReadDir(*dir); err == nil && len(entries) > 0 {
		if !*fresh {
			return fmt.Errorf("%s is not empty (an earlier cluster?): remove it or pass -fresh", *dir)
		}
		if err := os.RemoveAll(*dir); err != nil {
			return err
		}
	}
	o := vmtest.ClusterOptions{Nodes: *nodes, Image: img, Dir: *dir, Progress: os.Stderr, DiskSizeBytes: 4 << 30}
	if *consoles {
		var mu sync.Mutex
		o.Console = func(name string) io.Writer { return &prefixWriter{mu: &mu, w: os.Stderr, prefix: name + "| "} }
	}
	fmt.Fprintf(os.Stderr, "plinthctl: launching %d node(s) (%s acceleration); this takes minutes under TCG\n", *nodes, accel())
	c, err := vmtest.LaunchCluster(ctx, o)
	if err != nil {
		return err
	}
	defer c.Close()

	tw := tabwriter.NewWriter(os.Stderr, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "NAME\tID\tADDRESS\tCURATOR\tNODE MANAGEMENT\tCONSOLE")
	for _, n := range c.Nodes() {
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\n", n.Name, n.ID(), n.Addr, c.CuratorEndpoint(n), c.NodeManagementEndpoint(n),
			filepath.Join(n.Dir, "boot*", "console.log"))
	}
	tw.Flush()
	fmt.Fprintf(os.Stderr, "\nplinthctl: the cluster is up. In another shell:\n  export PLINTH_CONFIG=%s\n  plinthctl nodes list\nCtrl-C powers the nodes off.\n", c.OwnerDir())

	<-ctx.Done()
	fmt.Fprintln(os.Stderr, "\nplinthctl: powering the nodes off")
	var wg sync.WaitGroup
	for _, n := range c.Nodes() {
		wg.Add(1)
		go func() {
			defer wg.Done()
			sctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
			defer cancel()
			if err := c.StopNode(sctx, n, time.Minute); err != nil {
				fmt.Fprintf(os.Stderr, "plinthctl: %s: %v\n", n.Name, err)
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
