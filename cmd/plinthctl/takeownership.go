package main

import (
	"context"
	"crypto/ed25519"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/spf13/pflag"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"plinth.dev/plinth/api/clusterpb"
	"plinth.dev/plinth/platform/layout"
	"plinth.dev/plinth/platform/pki"
	"plinth.dev/plinth/roleserver/identity"
	"plinth.dev/plinth/roleserver/owner"
)

func init() {
	add(spec{path: "cluster takeownership", short: "Take ownership of a freshly bootstrapped cluster",
		long: "Take ownership of a freshly bootstrapped cluster: the holder of the owner key in its\n" +
			"bootstrap parameters gets an owner certificate, saved in --config with the curators to\n" +
			"use. --endpoint names the bootstrap node's curator (required here).",
		maxArgs: 0, new: func() command { return new(takeOwnershipCmd) }})
}

// takeOwnershipCmd is `plinthctl cluster takeownership --endpoint
// HOST:PORT`: the one-time hand-over of a new cluster to the holder of
// the owner key in its bootstrap parameters, saved as the owner
// configuration directory (--config). There are no credentials to dial
// with yet: the global --endpoint names the bootstrap curators.
//
// The cluster CA is trusted on first use unless --ca-fingerprint names
// it; either way its fingerprint is printed, to compare with the
// "cluster bootstrapped ... ca-sha256=" line on the bootstrap node's
// console.
type takeOwnershipCmd struct {
	fs            *pflag.FlagSet
	config        string
	endpoints     []string
	ownerKey      string
	directory     bool
	mgmtEndpoint  string
	force         bool
	caFingerprint string
	wait          time.Duration
}

func (c *takeOwnershipCmd) run(ctx context.Context, e *env, _ []string) error {
	c.config, c.endpoints = e.config, e.endpoints
	stderr := e.stderr
	opts, err := c.check()
	if err != nil {
		return err
	}
	key, cfg, err := c.loadConfig()
	if err != nil {
		return err
	}
	creds, info, err := c.takeOwnership(ctx, key, opts, stderr)
	if err != nil {
		return err
	}
	cfg.Key, cfg.Credentials, cfg.Curators = key, creds, slices.Clone(c.endpoints)
	if c.directory {
		for _, d := range info.GetDirectory().GetNodes() {
			for _, a := range d.GetAddresses() {
				if ep := net.JoinHostPort(a, strconv.Itoa(layout.CuratorPort)); !slices.Contains(cfg.Curators, ep) {
					cfg.Curators = append(cfg.Curators, ep)
				}
			}
		}
	}
	if c.mgmtEndpoint != "" {
		if err := c.recordMgmtEndpoint(cfg, info); err != nil {
			return err
		}
	}
	if err := cfg.Save(); err != nil {
		return err
	}
	c.report(cfg, stderr)
	return nil
}

func (c *takeOwnershipCmd) flags(fs *pflag.FlagSet) {
	c.fs = fs
	fs.StringVar(&c.ownerKey, "owner-key", "", "owner private key `file` written by plinthctl params --bootstrap (default: owner.key in the configuration dir)")
	fs.BoolVar(&c.directory, "directory-endpoints", true, "also use the curator addresses the cluster directory names (ignored unless given when every --endpoint is loopback, e.g. a forwarded port)")
	fs.StringVar(&c.mgmtEndpoint, "mgmt-endpoint", "", "`host:port` where the bootstrap node's NodeManagement is reached (e.g. the 127.0.0.1 port plinthctl run forwards), recorded for it in the endpoints file")
	fs.BoolVar(&c.force, "force", false, "replace an existing owner certificate in the configuration dir")
	fs.StringVar(&c.caFingerprint, "ca-fingerprint", "", "the cluster CA's SHA-256 fingerprint (`hex`, colons optional; the bootstrap node logs it as ca-sha256=): refuse any other CA instead of trusting it on first use")
	fs.DurationVar(&c.wait, "wait", 2*time.Minute, "keep trying for up to `duration` while the curator does not answer yet (a node still booting)")
}

// check checks the flags and returns the options of
// owner.TakeOwnership they ask for.
func (c *takeOwnershipCmd) check() ([]owner.TakeOwnershipOption, error) {
	if len(c.endpoints) == 0 {
		return nil, usagef("--endpoint HOST:PORT (the bootstrap node's curator) is required")
	}
	if c.mgmtEndpoint != "" {
		if _, _, err := net.SplitHostPort(c.mgmtEndpoint); err != nil {
			return nil, usagef("--mgmt-endpoint: %w", err)
		}
	}
	var opts []owner.TakeOwnershipOption
	if c.caFingerprint != "" {
		sum, err := pki.ParseFingerprint(c.caFingerprint)
		if err != nil {
			return nil, usagef("--ca-fingerprint: %w", err)
		}
		opts = append(opts, owner.WithCAFingerprint(sum))
	}
	if !c.fs.Changed("directory-endpoints") && allLoopback(c.endpoints) {
		// The directory names the node's own addresses, which the host
		// cannot reach through forwarded ports.
		c.directory = false
	}
	return opts, nil
}

// loadConfig reads the owner key and the configuration directory (a new
// one if it does not exist), which must not hold credentials already
// unless --force.
func (c *takeOwnershipCmd) loadConfig() (ed25519.PrivateKey, *owner.Config, error) {
	dir := c.config
	keyFile := c.ownerKey
	if keyFile == "" {
		keyFile = filepath.Join(dir, owner.KeyFile)
	}
	key, err := owner.ReadKeyFile(keyFile)
	if err != nil {
		return nil, nil, fmt.Errorf("%w (pass --owner-key, the owner.key plinthctl params wrote)", err)
	}
	cfg, err := owner.LoadConfig(dir)
	if errors.Is(err, os.ErrNotExist) {
		cfg, err = &owner.Config{Dir: dir, NodeEndpoints: map[string]string{}}, nil
	}
	if err != nil {
		return nil, nil, err
	}
	if cfg.Credentials != nil && !c.force {
		return nil, nil, fmt.Errorf("%s already holds an owner certificate; use another --config or --force", dir)
	}
	return key, cfg, nil
}

// recordMgmtEndpoint records --mgmt-endpoint in cfg for the bootstrap
// node, the one node of a fresh cluster's directory (info's).
func (c *takeOwnershipCmd) recordMgmtEndpoint(cfg *owner.Config, info *clusterpb.GetClusterInfoResponse) error {
	d := info.GetDirectory().GetNodes()
	if len(d) != 1 || d[0].GetId() == "" {
		return fmt.Errorf("--mgmt-endpoint: the cluster directory lists %d nodes, want the bootstrap node alone (add a \"node ID HOST:PORT\" line to %s instead)",
			len(d), filepath.Join(c.config, owner.EndpointsFile))
	}
	if cfg.NodeEndpoints == nil {
		cfg.NodeEndpoints = map[string]string{}
	}
	cfg.NodeEndpoints[d[0].GetId()] = c.mgmtEndpoint
	return nil
}

// report says what was saved, and the CA's fingerprint to compare with the
// bootstrap node's console unless --ca-fingerprint named it.
func (c *takeOwnershipCmd) report(cfg *owner.Config, stderr io.Writer) {
	dir := c.config
	fmt.Fprintf(stderr, "plinthctl: you own the cluster (CA %q); owner configuration saved in %s, curators %s\n",
		cfg.Credentials.CA.Subject.CommonName, dir, strings.Join(cfg.Curators, ", "))
	for id, ep := range cfg.NodeEndpoints {
		fmt.Fprintf(stderr, "plinthctl: node %s: NodeManagement at %s\n", id, ep)
	}
	fp := pki.Fingerprint(cfg.Credentials.CA)
	if c.caFingerprint != "" {
		fmt.Fprintf(stderr, "plinthctl: cluster CA fingerprint (SHA-256) %s, as --ca-fingerprint said\n", fp)
	} else {
		fmt.Fprintf(stderr, "plinthctl: cluster CA fingerprint (SHA-256) %s\n"+
			"plinthctl: trusted on first use: compare it with ca-sha256= on the bootstrap node's \"cluster bootstrapped\" console line; "+
			"if they differ, --endpoint was not your node: do not use %s, and take ownership of your node with --force --ca-fingerprint\n", fp, dir)
	}
}

// allLoopback reports whether every endpoint's host is a loopback address
// or localhost.
func allLoopback(endpoints []string) bool {
	for _, ep := range endpoints {
		host, _, err := net.SplitHostPort(ep)
		if err != nil {
			return false
		}
		if ip := net.ParseIP(host); host != "localhost" && (ip == nil || !ip.IsLoopback()) {
			return false
		}
	}
	return len(endpoints) > 0
}

// takeOwnership calls owner.TakeOwnership on the first endpoint, again
// every few seconds while the curator is unavailable (nothing listens at
// the node's forwarded port yet), for up to c.wait.
func (c *takeOwnershipCmd) takeOwnership(ctx context.Context, key ed25519.PrivateKey, opts []owner.TakeOwnershipOption, stderr io.Writer) (*identity.Credentials, *clusterpb.GetClusterInfoResponse, error) {
	deadline := time.Now().Add(c.wait)
	said := false
	for {
		tctx, cancel := context.WithTimeout(ctx, callTimeout)
		creds, info, err := owner.TakeOwnership(tctx, c.endpoints[0], key, opts...)
		cancel()
		if status.Code(err) != codes.Unavailable || time.Now().After(deadline) {
			return creds, info, err
		}
		if !said {
			fmt.Fprintf(stderr, "plinthctl: the curator at %s does not answer yet (is the node still booting?); trying again for up to %v\n", c.endpoints[0], time.Until(deadline).Round(time.Second))
			said = true
		}
		select {
		case <-ctx.Done():
			return nil, nil, ctx.Err()
		case <-time.After(2 * time.Second):
		}
	}
}
