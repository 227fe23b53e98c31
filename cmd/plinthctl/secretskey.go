package main

import (
	"context"
	"fmt"
	"io"
	"sort"
	"strings"
	"time"

	"github.com/spf13/pflag"

	"plinth.dev/plinth/api/clusterpb"
	"plinth.dev/plinth/roleserver/owner"
)

func init() {
	add(spec{path: "cluster secrets-key status", short: "Show the keys Kubernetes Secrets are encrypted with inside etcd, and which each controller runs with",
		maxArgs: 0, formats: textFormats, new: func() command { return new(secretsKeyCmd) }})
	add(spec{path: "cluster secrets-key rotate", short: "Replace the key Kubernetes Secrets are encrypted with inside etcd, and write every Secret anew with it",
		long: "Replace the key Kubernetes Secrets are encrypted with inside etcd: add a new key, make it\n" +
			"the one that writes, write every Secret anew, retire the old one. Each step waits for every\n" +
			"controller; a rotation cut short is finished by running rotate again.",
		maxArgs: 0, formats: textFormats, new: func() command { return &secretsKeyCmd{rotate: true} }})
}

// secretsKeyCmd is `plinthctl cluster secrets-key status` and `plinthctl
// cluster secrets-key rotate [--kube-server HOST:PORT] [--timeout D]`, as
// the owner. Secrets are encrypted inside etcd (secretbox) with a key the
// curators keep outside the API servers' reach; rotate replaces it:
//
//	add       a new key every controller can read, none writes with yet
//	          … every controller's API server runs with it …
//	activate  the new key writes, the old one only reads
//	          … every controller's API server runs with it …
//	rewrite   every Secret is written anew, now with the new key
//	retire    the old key goes
//
// Each step waits until every UP controller runs with the previous one
// (its control plane restarts with new keys: under TCG a minute or two),
// so no API server ever meets a Secret it cannot read. A rotation cut
// short is finished by running rotate again. Both print the keys as
// they are at the end.
type secretsKeyCmd struct {
	rotate     bool
	kubeServer string
	timeout    time.Duration
}

func (c *secretsKeyCmd) flags(fs *pflag.FlagSet) {
	if !c.rotate {
		return
	}
	fs.StringVar(&c.kubeServer, "kube-server", "", "Kubernetes API server `host:port` to rewrite the Secrets through (default: the first the cluster names)")
	fs.DurationVar(&c.timeout, "timeout", 15*time.Minute, "how long each step may wait for every controller")
}

func (c *secretsKeyCmd) run(ctx context.Context, e *env, _ []string) error {
	cl, err := e.dial()
	if err != nil {
		return err
	}
	defer cl.Close()
	step := clusterpb.RotateSecretsKeyRequest_STEP_STATUS
	if c.rotate {
		if err := c.rotateKeys(ctx, cl, e.stderr); err != nil {
			return err
		}
		step = clusterpb.RotateSecretsKeyRequest_STEP_RETIRE
	}
	r, err := c.step(ctx, cl, step)
	if err != nil {
		return err
	}
	if c.rotate {
		fmt.Fprintln(e.stderr, "plinthctl: the old key is retired")
	}
	return e.show(r, func(w io.Writer) error { printSecretsKeys(w, r); return nil })
}

// rotateKeys takes the steps of a rotation up to retire: add, activate
// (each waited for) and the rewrite of every Secret.
func (c *secretsKeyCmd) rotateKeys(ctx context.Context, cl *owner.Client, stderr io.Writer) error {
	for _, s := range []clusterpb.RotateSecretsKeyRequest_Step{clusterpb.RotateSecretsKeyRequest_STEP_ADD, clusterpb.RotateSecretsKeyRequest_STEP_ACTIVATE} {
		r, err := c.step(ctx, cl, s)
		if err != nil {
			return err
		}
		if err := c.waitControllers(ctx, cl, r.GetGeneration(), stderr); err != nil {
			return err
		}
	}
	actx, cancel := context.WithTimeout(ctx, c.timeout)
	defer cancel()
	api, err := cl.KubeAPI(actx, c.kubeServer)
	if err != nil {
		return err
	}
	n, err := api.RewriteSecrets(actx)
	if err != nil {
		return fmt.Errorf("rewriting the Secrets with the new key (run plinthctl cluster secrets-key rotate again to finish): %w", err)
	}
	fmt.Fprintf(stderr, "plinthctl: %d Secrets written anew with the new key\n", n)
	return nil
}

func (c *secretsKeyCmd) step(ctx context.Context, cl *owner.Client, s clusterpb.RotateSecretsKeyRequest_Step) (*clusterpb.RotateSecretsKeyResponse, error) {
	ctx, cancel := context.WithTimeout(ctx, callTimeout)
	defer cancel()
	return cl.RotateSecretsKey(ctx, s)
}

// waitControllers waits until every UP controller's API server runs
// with generation or a later one.
func (c *secretsKeyCmd) waitControllers(ctx context.Context, cl *owner.Client, generation uint64, stderr io.Writer) error {
	deadline := time.Now().Add(c.timeout)
	for {
		r, err := c.step(ctx, cl, clusterpb.RotateSecretsKeyRequest_STEP_STATUS)
		if err != nil {
			return err
		}
		var behind []string
		for id, g := range r.GetControllers() {
			if g < generation {
				behind = append(behind, id)
			}
		}
		if len(behind) == 0 {
			fmt.Fprintf(stderr, "plinthctl: every controller runs with key generation %d\n", generation)
			return nil
		}
		sort.Strings(behind)
		if time.Now().After(deadline) {
			return fmt.Errorf("controllers %s do not run with key generation %d after %v (run plinthctl cluster secrets-key rotate again to go on)", strings.Join(behind, ", "), generation, c.timeout)
		}
		fmt.Fprintf(stderr, "plinthctl: waiting for %s to restart with key generation %d\n", strings.Join(behind, ", "), generation)
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(5 * time.Second):
		}
	}
}

func printSecretsKeys(w io.Writer, r *clusterpb.RotateSecretsKeyResponse) {
	fmt.Fprintf(w, "generation %d\n", r.GetGeneration())
	for _, k := range r.GetKeys() {
		fmt.Fprintf(w, "key %s %s\n", k.GetName(), map[bool]string{true: "writes", false: "reads"}[k.GetWrite()])
	}
	var ids []string
	for id := range r.GetControllers() {
		ids = append(ids, id)
	}
	sort.Strings(ids)
	for _, id := range ids {
		fmt.Fprintf(w, "controller %s runs generation %d\n", id, r.GetControllers()[id])
	}
}
