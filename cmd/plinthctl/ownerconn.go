package main

import (
	"context"
	"errors"
	"fmt"
	"os"
	"time"

	"plinth.dev/plinth/roleserver/owner"
)

// Cluster commands act as the cluster's owner, with the configuration
// directory of roleserver/owner (--config, default $PLINTH_CONFIG, else
// $XDG_CONFIG_HOME/plinth or ~/.config/plinth).

// callTimeout bounds one non-streaming command.
const callTimeout = 30 * time.Second

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

// defaultConfigDir is --config's default: $PLINTH_CONFIG, else the owner
// package's default directory.
func defaultConfigDir() string {
	if d := os.Getenv("PLINTH_CONFIG"); d != "" {
		return d
	}
	d, _ := owner.DefaultDir()
	return d
}

// dial connects as the owner with the configuration in --config, through
// the --endpoint curators if given.
func (e *env) dial() (*owner.Client, error) {
	cfg, err := owner.LoadConfig(e.config)
	if err != nil {
		if errors.Is(err, os.ErrNotExist) {
			return nil, fmt.Errorf("no owner configuration in %s (run plinthctl cluster takeownership, or pass --config)", e.config)
		}
		return nil, err
	}
	return e.dialWith(cfg)
}

// dialWith connects with cfg, loaded already, through the --endpoint
// curators if given; cfg itself keeps its own.
func (e *env) dialWith(cfg *owner.Config) (*owner.Client, error) {
	c := *cfg
	if len(e.endpoints) > 0 {
		c.Curators = e.endpoints
	}
	return owner.Dial(&c)
}

// call is dial for one call: the client, a context bounded by
// callTimeout, and what closes both.
func (e *env) call(ctx context.Context) (*owner.Client, context.Context, func(), error) {
	cl, err := e.dial()
	if err != nil {
		return nil, nil, nil, err
	}
	ctx, cancel := context.WithTimeout(ctx, callTimeout)
	return cl, ctx, func() { cancel(); cl.Close() }, nil
}

// dialNode is dial for a command on one node: the client and the ID the
// NODE argument ref names.
func (e *env) dialNode(ctx context.Context, ref string) (*owner.Client, string, error) {
	c, err := e.dial()
	if err != nil {
		return nil, "", err
	}
	id, err := nodeID(ctx, c, ref)
	if err != nil {
		c.Close()
		return nil, "", err
	}
	return c, id, nil
}
