package launch

import (
	"context"
	"crypto/ed25519"
	"fmt"
	"path/filepath"
	"regexp"

	"plinth.dev/plinth/platform/pki"
	"plinth.dev/plinth/roleserver/identity"
	"plinth.dev/plinth/roleserver/owner"
)

// takeOwnership waits for the bootstrap node's curator (retrying while it
// is not up yet) and saves the owner configuration.
func (c *Cluster) takeOwnership(ctx context.Context, boot *ClusterNode, key ed25519.PrivateKey) error {
	ep := c.CuratorEndpoint(boot)
	// The CA fingerprint the bootstrap node logs on its console (a
	// channel the owner trusts) pins the CA: nothing is sent to a server
	// presenting another one.
	lines, err := boot.VM().WaitForLine(ctx, bootstrappedLine)
	if err != nil {
		return fmt.Errorf("launch: %s: no bootstrap line with the CA fingerprint: %w", boot.Name, err)
	}
	fp, err := pki.ParseFingerprint(lines[1])
	if err != nil {
		return err
	}
	c.logf("%s: waiting for its curator (forwarded to %s) to take ownership, CA pinned to %s", boot.Name, ep, pki.FormatFingerprint(fp))
	var creds *identity.Credentials
	err = c.retry(ctx, boot, "taking ownership", func(ctx context.Context) error {
		var err error
		creds, _, err = owner.TakeOwnership(ctx, ep, key, owner.WithCAFingerprint(fp))
		return err
	})
	if err != nil {
		return err
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	c.cfg = &owner.Config{Dir: c.OwnerDir(), Key: key, Credentials: creds, NodeEndpoints: map[string]string{}}
	c.cfg.Curators = c.curatorsLocked()
	if c.client, err = owner.Dial(c.cfg); err != nil {
		return err
	}
	if err := c.cfg.Save(); err != nil {
		return err
	}
	c.logf("took ownership; owner configuration in %s", c.OwnerDir())
	return nil
}

// bootstrappedLine is the bootstrap node's console line naming the
// cluster CA's fingerprint.
var bootstrappedLine = regexp.MustCompile(`I root\.roleserver\.controlplane: cluster bootstrapped: .*ca-sha256=([0-9A-F:]+)`)

// curatorsLocked lists the forwarded curator ports of the nodes started
// so far, the bootstrap node first: nodes without a curator refuse at
// once, and the client moves on to the next.
func (c *Cluster) curatorsLocked() []string {
	var out []string
	for _, n := range c.slots {
		n.mu.Lock()
		started := n.used && n.vm != nil
		n.mu.Unlock()
		if started {
			out = append(out, c.CuratorEndpoint(n))
		}
	}
	return out
}

// updateOwnerLocked brings the client and the saved owner configuration
// up to date with the started nodes.
func (c *Cluster) updateOwnerLocked() error {
	if c.cfg == nil {
		return nil
	}
	c.cfg.Curators = c.curatorsLocked()
	c.client.SetCurators(c.cfg.Curators)
	for id, ep := range c.cfg.NodeEndpoints {
		c.client.SetNodeEndpoint(id, ep)
	}
	return c.cfg.Save()
}

// OwnerCommands are the shell commands (one line each) that reach c as
// its owner with plinthctl and kubectl called as given: what `plinthctl
// launch` prints, and TestKubernetesTwoNodes runs as printed. They set
// PLINTH_CONFIG to the owner configuration, list the nodes and, for a
// Kubernetes cluster, write a kubeconfig for the first node's forwarded
// API server (waiting for it to serve) and list the Kubernetes nodes.
func (c *Cluster) OwnerCommands(plinthctl, kubectl string) []string {
	cmds := []string{"export PLINTH_CONFIG=" + c.OwnerDir(), plinthctl + " node list"}
	if nodes := c.Nodes(); c.opts.Kubernetes && len(nodes) > 0 {
		kc := filepath.Join(c.opts.Dir, "kubeconfig")
		cmds = append(cmds, fmt.Sprintf("%s cluster kubeconfig --server https://%s --wait 10m --file %s && %s --kubeconfig %s get nodes",
			plinthctl, c.KubernetesAPIEndpoint(nodes[0]), kc, kubectl, kc))
	}
	return cmds
}
