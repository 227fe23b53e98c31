package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"text/tabwriter"

	"github.com/spf13/pflag"

	"plinth.dev/plinth/roleserver/owner"
)

// version is plinthctl's own version; make sets it (-X main.version).
var version = "dev"

func init() {
	add(spec{path: "version", short: "Print plinthctl's version and, with a cluster, every node's",
		maxArgs: 0, formats: readFormats, group: groupOther, new: func() command { return new(versionCmd) }})
}

// versionCmd is `plinthctl version [--client]`.
type versionCmd struct {
	client bool
}

func (c *versionCmd) flags(fs *pflag.FlagSet) {
	fs.BoolVar(&c.client, "client", false, "plinthctl's version only, without asking the cluster")
}

// versions is what version prints as JSON or YAML.
type versions struct {
	Client string        `json:"client"`
	Nodes  []nodeVersion `json:"nodes,omitempty"`
}

type nodeVersion struct {
	ID      string `json:"id"`
	Version string `json:"version"`
	Slot    string `json:"slot,omitempty"`
}

func (c *versionCmd) run(ctx context.Context, e *env, _ []string) error {
	v := versions{Client: version}
	var err error
	if !c.client {
		v.Nodes, err = c.nodes(ctx, e)
	}
	if perr := e.show(v, func(w io.Writer) error { return printVersions(w, v) }); perr != nil {
		return perr
	}
	return err
}

// nodes asks the cluster of --config for its nodes' versions; none
// before ownership is taken, which is no error for version.
func (c *versionCmd) nodes(ctx context.Context, e *env) ([]nodeVersion, error) {
	cfg, err := owner.LoadConfig(e.config)
	if errors.Is(err, os.ErrNotExist) || (err == nil && cfg.Credentials == nil) {
		return nil, nil // no cluster owned from here
	}
	if err != nil {
		return nil, err
	}
	cl, err := e.dialWith(cfg)
	if err != nil {
		return nil, err
	}
	defer cl.Close()
	ctx, cancel := context.WithTimeout(ctx, callTimeout)
	defer cancel()
	nodes, err := cl.Nodes(ctx)
	if err != nil {
		return nil, fmt.Errorf("the nodes' versions: %w", err)
	}
	out := make([]nodeVersion, 0, len(nodes))
	for _, n := range nodes {
		st := n.GetStatus()
		out = append(out, nodeVersion{ID: n.GetId(), Version: st.GetVersion(), Slot: st.GetSoftware().GetSlot()})
	}
	return out, nil
}

func printVersions(w io.Writer, v versions) error {
	fmt.Fprintf(w, "Client: %s\n", v.Client)
	if len(v.Nodes) == 0 {
		return nil
	}
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "NODE\tVERSION\tSLOT")
	for _, n := range v.Nodes {
		fmt.Fprintf(tw, "%s\t%s\t%s\n", n.ID, orDash(n.Version), orDash(n.Slot))
	}
	return tw.Flush()
}
