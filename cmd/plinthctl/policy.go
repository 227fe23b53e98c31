package main

import (
	"bytes"
	"context"
	"crypto/ed25519"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"slices"
	"strings"

	"github.com/spf13/pflag"
	"google.golang.org/protobuf/proto"

	"plinth.dev/plinth/api/clusterpb"
	"plinth.dev/plinth/platform/layout"
	"plinth.dev/plinth/platform/releasekeys"
)

func init() {
	add(spec{path: "cluster policy", short: "Show or change the cluster policy: Pod Security level, allowed host paths, image registries, release keys",
		long: "Show the cluster policy; with flags, change those parts of it (the rest stays) and show\n" +
			"the result. Registry passwords are read from a file, never a flag, and never printed.",
		maxArgs: 0, formats: textFormats, new: func() command { return new(policyCmd) }})
}

// policyCmd is `plinthctl cluster policy [--pod-security LEVEL]
// [--allow-host-path PATH...|--no-host-paths] [--allow-external-ips
// CIDR...|--no-external-ips] [--registry HOST [--mirror URL...|--no-mirrors]
// [--registry-ca PEM|--no-registry-ca] [--registry-username NAME
// --registry-password-file FILE|--no-registry-credentials]]
// [--remove-registry HOST] [--add-release-key KEY] [--remove-release-key
// KEY] [--sign-key KEY]`, as the owner. Without flags it prints the
// policy; with any, it changes those parts (the rest stays) and prints
// the result.
//
// The Pod Security level and the allowed host paths reach the API
// servers at once (their control plane restarts with them); the image
// registries reach the workers' containerd and kubelet at once (see
// roleserver/kubernetes/registries.go); a release key signs the images
// nodes install (plinthctl build --sign-key), and a change of the release
// keys is a key set signed by a current one (--sign-key) and by every key
// it adds: the owner's certificate alone changes none (platform/
// releasekeys). Passwords are read from a file (never a flag: it would
// stay in the shell's history) and never printed.
type policyCmd struct {
	fs          *pflag.FlagSet
	podSecurity string
	hostPaths   listFlag
	noHostPaths bool
	externalIPs listFlag
	noExternal  bool
	registry    registryFlags
	addKeys     listFlag
	removeKeys  listFlag
	signKeys    listFlag
}

func (c *policyCmd) flags(fs *pflag.FlagSet) {
	c.fs = fs
	fs.StringVar(&c.podSecurity, "pod-security", "", "Pod Security `level` enforced in namespaces that name none: "+strings.Join(clusterpb.PodSecurityLevels, "|")+" (privileged is node root)")
	fs.Var(&c.hostPaths, "allow-host-path", "host `path` under "+layout.HostVolumesDir+" (the only place below the node's state that may be opened) that pods and PersistentVolumes may use (repeat; replaces the list)")
	fs.BoolVar(&c.noHostPaths, "no-host-paths", false, "allow no host path below the node's state (the default)")
	fs.Var(&c.externalIPs, "allow-external-ips", "address range `CIDR` Services may name as external IPs; it must hold no node's address (repeat; replaces the list)")
	fs.BoolVar(&c.noExternal, "no-external-ips", false, "allow Services no external IP (the default)")
	c.registry.define(fs)
	fs.Var(&c.addKeys, "add-release-key", "release key `file` (private: plinthctl release key FILE) to add: it signs the new key set, and its signatures on images let nodes install them (repeat)")
	fs.Var(&c.removeKeys, "remove-release-key", "release key `file` (public or private) to remove (the last one cannot be)")
	fs.Var(&c.signKeys, "sign-key", "a current release key `file` (private) that signs the new key set: nodes take it only so signed (repeat; not needed for the first key of a cluster)")
}

// check refuses flags that say two things, before anything is sent.
func (c *policyCmd) check() error {
	switch {
	case len(c.hostPaths) > 0 && c.noHostPaths:
		return usagef("give --allow-host-path or --no-host-paths, not both")
	case len(c.externalIPs) > 0 && c.noExternal:
		return usagef("give --allow-external-ips or --no-external-ips, not both")
	case len(c.signKeys) > 0 && len(c.addKeys) == 0 && len(c.removeKeys) == 0:
		return usagef("--sign-key signs a change of the release keys: give --add-release-key or --remove-release-key")
	}
	return c.registry.check(c.fs)
}

func (c *policyCmd) run(ctx context.Context, e *env, _ []string) error {
	if err := c.check(); err != nil {
		return err
	}
	cl, ctx, done, err := e.call(ctx)
	if err != nil {
		return err
	}
	defer done()
	info, err := cl.ClusterInfo(ctx)
	if err != nil {
		return err
	}
	cfg := info.GetConfiguration()
	req, err := c.request(cfg)
	if err != nil {
		return err
	}
	if proto.Size(req) > 0 {
		if cfg, err = cl.UpdatePolicy(ctx, req); err != nil {
			return err
		}
		fmt.Fprintln(e.stderr, "plinthctl: cluster policy updated")
	}
	return e.show(withoutPasswords(cfg), func(w io.Writer) error { printPolicy(w, cfg); return nil })
}

// request is the change of cfg the flags ask for (empty for none).
func (c *policyCmd) request(cfg *clusterpb.ClusterConfiguration) (*clusterpb.UpdateClusterPolicyRequest, error) {
	req := &clusterpb.UpdateClusterPolicyRequest{}
	if c.podSecurity != "" || len(c.hostPaths) > 0 || c.noHostPaths || len(c.externalIPs) > 0 || c.noExternal || c.registry.given(c.fs) {
		k := proto.Clone(cfg.GetKubernetes()).(*clusterpb.KubernetesPolicy)
		if k == nil {
			k = &clusterpb.KubernetesPolicy{}
		}
		if err := c.registry.apply(k); err != nil {
			return nil, err
		}
		if c.podSecurity != "" {
			k.PodSecurityLevel = c.podSecurity
		}
		if len(c.hostPaths) > 0 || c.noHostPaths {
			k.AllowedHostPaths = c.hostPaths
		}
		if len(c.externalIPs) > 0 || c.noExternal {
			k.AllowedExternalIps = c.externalIPs
		}
		if err := k.Check(); err != nil {
			return nil, err
		}
		req.Kubernetes = k
	}
	if len(c.addKeys) > 0 || len(c.removeKeys) > 0 {
		next, err := c.nextKeySet(cfg)
		if err != nil {
			return nil, err
		}
		req.ReleaseKeys = clusterpb.NewSignedStatement(next)
	}
	return req, nil
}

// withoutPasswords is cfg for -o json and yaml: the registries'
// passwords left out, as the text leaves them out.
func withoutPasswords(cfg *clusterpb.ClusterConfiguration) *clusterpb.ClusterConfiguration {
	cfg = proto.Clone(cfg).(*clusterpb.ClusterConfiguration)
	for _, r := range cfg.GetKubernetes().GetImageRegistries() {
		r.Password = ""
	}
	return cfg
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
	ips := strings.Join(k.GetAllowedExternalIps(), " ")
	if ips == "" {
		ips = "none (default)"
	}
	fmt.Fprintf(w, "external IPs:       %s\n", ips)
	printRegistries(w, k.GetImageRegistries())
	if len(cfg.GetReleaseKeys()) == 0 {
		fmt.Fprintln(w, "release keys:       none: nodes install no update")
	} else {
		fmt.Fprintf(w, "release key set:    version %d of the signed chain (nodes verify it)\n", len(cfg.GetReleaseKeyChain()))
	}
	for i, rk := range cfg.GetReleaseKeys() {
		label := "release keys:"
		if i > 0 {
			label = ""
		}
		sum := sha256.Sum256(rk)
		fmt.Fprintf(w, "%-19s ed25519 %s (sha256 %s)\n", label, hex.EncodeToString(rk), hex.EncodeToString(sum[:8]))
	}
	fmt.Fprintf(w, "owner credentials:  epoch %d (plinthctl cluster kubeconfig --revoke-all moves it)\n", cfg.GetKubernetesOwnerEpoch())
	fmt.Fprintf(w, "nodes without TPM:  %v\n", map[bool]string{true: "allowed", false: "refused"}[cfg.GetAllowNodesWithoutTpm()])
}

// nextKeySet is the next version of cfg's release key set, with
// --add-release-key's keys added and --remove-release-key's removed,
// signed by --sign-key's keys and by every key added (each proves its
// holder has it). The curator checks it extends the chain, and every
// node again.
func (c *policyCmd) nextKeySet(cfg *clusterpb.ClusterConfiguration) (releasekeys.Signed, error) {
	chain := cfg.ReleaseKeyChainSigned()
	var prev *releasekeys.Signed
	keys := slices.Clone(cfg.GetReleaseKeys())
	if len(chain) > 0 {
		prev = &chain[len(chain)-1]
	} else if len(keys) > 0 {
		return releasekeys.Signed{}, errors.New("the cluster's release keys are not a signed chain (a cluster from before chains): its nodes take no key set; found a new cluster or ask for help")
	}
	var signers []ed25519.PrivateKey
	for _, f := range c.addKeys {
		k, err := readReleaseKey(f)
		if err != nil {
			return releasekeys.Signed{}, fmt.Errorf("--add-release-key: %w (the private key: it signs the key set that adds it)", err)
		}
		pub := k.Public().(ed25519.PublicKey)
		if !slices.ContainsFunc(keys, func(o []byte) bool { return bytes.Equal(o, pub) }) {
			keys = append(keys, pub)
		}
		signers = append(signers, k)
	}
	for _, f := range c.removeKeys {
		pub, err := readAnyReleaseKey(f)
		if err != nil {
			return releasekeys.Signed{}, fmt.Errorf("--remove-release-key: %w", err)
		}
		had := len(keys)
		keys = slices.DeleteFunc(keys, func(o []byte) bool { return bytes.Equal(o, pub) })
		if len(keys) == had {
			return releasekeys.Signed{}, fmt.Errorf("--remove-release-key %s: not one of the cluster's release keys", f)
		}
	}
	if len(keys) == 0 {
		return releasekeys.Signed{}, errors.New("refusing to remove the last release key: no node could install an update again (add the new key first)")
	}
	for _, f := range c.signKeys {
		k, err := readReleaseKey(f)
		if err != nil {
			return releasekeys.Signed{}, fmt.Errorf("--sign-key: %w", err)
		}
		signers = append(signers, k)
	}
	body, err := releasekeys.NextKeySet(prev, keys)
	if err != nil {
		return releasekeys.Signed{}, err
	}
	next := releasekeys.Sign(body, signers...)
	if _, err := releasekeys.CheckNext(chain, next); err != nil {
		return releasekeys.Signed{}, fmt.Errorf("%w (a change of the release keys is signed by a current release key: --sign-key FILE)", err)
	}
	return next, nil
}

// readAnyReleaseKey reads a release key's public key from its public
// key file or its private key file.
func readAnyReleaseKey(path string) (ed25519.PublicKey, error) {
	if k, err := readReleaseKey(path); err == nil {
		return k.Public().(ed25519.PublicKey), nil
	}
	return readOwnerKey(path)
}
