package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"os"
	"time"

	"plinth.dev/plinth/roleserver/owner"
)

// Cluster commands act as the cluster's owner, with the configuration
// directory of roleserver/owner (-config, default $PLINTH_CONFIG, else
// $XDG_CONFIG_HOME/plinth or ~/.config/plinth).

// callTimeout bounds one non-streaming command.
const callTimeout = 30 * time.Second

// dialOwner connects with the owner configuration in dir.
func dialOwner(dir string) (*owner.Client, error) {
	cfg, err := owner.LoadConfig(dir)
	if err != nil {
		if errors.Is(err, os.ErrNotExist) {
			return nil, fmt.Errorf("no owner configuration in %s (run plinthctl takeownership, or pass -config)", dir)
		}
		return nil, err
	}
	return owner.Dial(cfg)
}

// ownerCall is dialOwner for one call: the client, a context bounded by
// callTimeout, and what closes both.
func ownerCall(ctx context.Context, dir string) (*owner.Client, context.Context, func(), error) {
	cl, err := dialOwner(dir)
	if err != nil {
		return nil, nil, nil, err
	}
	ctx, cancel := context.WithTimeout(ctx, callTimeout)
	return cl, ctx, func() { cancel(); cl.Close() }, nil
}

// nodeID resolves a NODE argument to a node ID.
func nodeID(ctx context.Context, c *owner.Client, ref string) (string, error) {
	ctx, cancel := context.WithTimeout(ctx, callTimeout)
	defer cancel()
	n, err := c.FindNode(ctx, ref)
	if err != nil {
		return "", err
	}
	return n.GetId(), nil
}

// dialForNode parses the flags of a command that takes one NODE argument,
// connects with the owner credentials and resolves NODE to its ID.
func dialForNode(ctx context.Context, fs *flag.FlagSet, args []string, dir *string, usage string) (*owner.Client, string, error) {
	pos, err := parseArgs(fs, args)
	if err != nil {
		return nil, "", err
	}
	if len(pos) != 1 {
		return nil, "", errors.New(usage)
	}
	c, err := dialOwner(*dir) // after parsing: -config is a flag
	if err != nil {
		return nil, "", err
	}
	id, err := nodeID(ctx, c, pos[0])
	if err != nil {
		c.Close()
		return nil, "", err
	}
	return c, id, nil
}
