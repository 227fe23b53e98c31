package main

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"io"
	"strings"

	"google.golang.org/protobuf/proto"

	"plinth.dev/plinth/api/clusterpb"
	"plinth.dev/plinth/platform/layout"
)

func init() {
	register("policy", "show or change the cluster policy: Pod Security level, allowed host paths, image registries, release keys", func() verb { return new(policyCmd) })
}

// policyCmd is `plinthctl policy [-pod-security LEVEL] [-allow-host-path
// PATH...|-no-host-paths] [-registry HOST [-mirror URL...|-no-mirrors]
// [-registry-ca PEM|-no-registry-ca] [-registry-username NAME
// -registry-password-file FILE|-no-registry-credentials]]
// [-remove-registry HOST] [-add-release-key PUB] [-remove-release-key
// PUB]`, as the owner. Without flags it prints the policy; with any, it
// changes those parts (the rest stays) and prints the result.
//
// The Pod Security level and the allowed host paths reach the API
// servers at once (their control plane restarts with them); the image
// registries reach the workers' containerd and kubelet at once (see
// roleserver/kubernetes/registries.go); a release key signs the images
// nodes install (plinthctl build -sign-key). Passwords are read from a
// file (never a flag: it would stay in the shell's history) and printed
// as "(set)".
type policyCmd struct {
	config      string
	podSecurity string
	hostPaths   listFlag
	noHostPaths bool
	registry    registryFlags
	addKeys     listFlag
	removeKeys  listFlag
}

func (c *policyCmd) run(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs := newFlagSet("policy", stderr)
	configFlagVar(fs, &c.config)
	fs.StringVar(&c.podSecurity, "pod-security", "", "Pod Security level enforced in namespaces that name none: "+strings.Join(clusterpb.PodSecurityLevels, "|")+" (privileged is node root)")
	fs.Var(&c.hostPaths, "allow-host-path", "host `path` under "+layout.HostVolumesDir+" (the only place below the node's state that may be opened) that pods and PersistentVolumes may use (repeat; replaces the list)")
	fs.BoolVar(&c.noHostPaths, "no-host-paths", false, "allow no host path below the node's state (the default)")
	c.registry.define(fs)
	fs.Var(&c.addKeys, "add-release-key", "ed25519 public key `file` whose signatures on an image let nodes install it (repeat)")
	fs.Var(&c.removeKeys, "remove-release-key", "release key `file` to remove (the last one cannot be)")
	if err := noArgs(fs, args); err != nil {
		return err
	}
	if len(c.hostPaths) > 0 && c.noHostPaths {
		return fmt.Errorf("give -allow-host-path or -no-host-paths, not both")
	}
	if err := c.registry.check(fs); err != nil {
		return err
	}
	cl, ctx, done, err := ownerCall(ctx, c.config)
	if err != nil {
		return err
	}
	defer done()
	info, err := cl.ClusterInfo(ctx)
	if err != nil {
		return err
	}
	cfg := info.GetConfiguration()
	req := &clusterpb.UpdateClusterPolicyRequest{}
	if c.podSecurity != "" || len(c.hostPaths) > 0 || c.noHostPaths || c.registry.given(fs) {
		k := proto.Clone(cfg.GetKubernetes()).(*clusterpb.KubernetesPolicy)
		if k == nil {
			k = &clusterpb.KubernetesPolicy{}
		}
		if err := c.registry.apply(fs, k); err != nil {
			return err
		}
		if c.podSecurity != "" {
			k.PodSecurityLevel = c.podSecurity
		}
		if len(c.hostPaths) > 0 || c.noHostPaths {
			k.AllowedHostPaths = c.hostPaths
		}
		if err := k.Check(); err != nil {
			return err
		}
		req.Kubernetes = k
	}
	for _, f := range c.addKeys {
		k, err := readOwnerKey(f)
		if err != nil {
			return fmt.Errorf("-add-release-key: %w", err)
		}
		req.AddReleaseKeys = append(req.AddReleaseKeys, k)
	}
	for _, f := range c.removeKeys {
		k, err := readOwnerKey(f)
		if err != nil {
			return fmt.Errorf("-remove-release-key: %w", err)
		}
		req.RemoveReleaseKeys = append(req.RemoveReleaseKeys, k)
	}
	if proto.Size(req) > 0 {
		if cfg, err = cl.UpdatePolicy(ctx, req); err != nil {
			return err
		}
		fmt.Fprintln(stderr, "plinthctl: cluster policy updated")
	}
	printPolicy(stdout, cfg)
	return nil
}

// printPolicy prints the parts of the cluster policy the owner sets.
func printPolicy(w io.Writer, cfg *clusterpb.ClusterConfiguration) {
	k := cfg.GetKubernetes()
	level := k.GetPodSecurityLevel()
	if level == "" {
		level = "baseline (default)"
	}
	fmt.Fprintf(w, "pod security:       %s\n", level)
	paths := strings.Join(k.GetAllowedHostPaths(), " ")
	if paths == "" {
		paths = "none (default)"
	}
	fmt.Fprintf(w, "allowed host paths: %s\n", paths)
	printRegistries(w, k.GetImageRegistries())
	if len(cfg.GetReleaseKeys()) == 0 {
		fmt.Fprintln(w, "release keys:       none: nodes install no update")
	}
	for i, rk := range cfg.GetReleaseKeys() {
		label := "release keys:"
		if i > 0 {
			label = ""
		}
		sum := sha256.Sum256(rk)
		fmt.Fprintf(w, "%-19s ed25519 %s (sha256 %s)\n", label, hex.EncodeToString(rk), hex.EncodeToString(sum[:8]))
	}
	fmt.Fprintf(w, "owner credentials:  epoch %d (plinthctl kubeconfig -revoke-all moves it)\n", cfg.GetKubernetesOwnerEpoch())
	fmt.Fprintf(w, "nodes without TPM:  %v\n", map[bool]string{true: "allowed", false: "refused"}[cfg.GetAllowNodesWithoutTpm()])
}
