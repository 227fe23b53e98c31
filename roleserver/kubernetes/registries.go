package kubernetes

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"

	"plinth.dev/plinth/api/clusterpb"
	"plinth.dev/plinth/platform/event"
	"plinth.dev/plinth/platform/layout"
	"plinth.dev/plinth/platform/supervisor"
	"plinth.dev/plinth/roleserver/localstorage"
)

// A worker pulls images as the cluster policy's image registries say
// (clusterpb.ImageRegistry, checked by the curator):
//
//	cluster policy (Curator.WatchClusterPolicy)
//	   │
//	   ├─► registries runnable, on every change (tmpfs only):
//	   │     containerd hosts/<host>/hosts.toml (+ ca.pem)   mirrors, CAs
//	   │     registries/credentials.json (0600)            credentials
//	   │
//	   └─► kubelet, when the registries with credentials change: restart
//	         --image-credential-provider-config  registries/credential-providers.json
//	         --image-credential-provider-bin-dir registries/bin
//	                     └─ kube-credential-provider → kube credential-provider -file credentials.json
//
// Why this split: containerd reads its hosts directory (config_path) at
// every pull, so mirrors and CAs apply at once; containerd 2.x has no
// credentials in hosts.toml, and its CRI registry auth is deprecated, so
// credentials go the way the kubelet supports: an image credential
// provider, which the kubelet runs per pull (its answers cached a minute)
// and which answers from the file. The kubelet reads the provider's
// configuration, the registries it matches, once: only a change of that
// set restarts it. The credentials never reach /data: the policy lives in
// etcd on the encrypted disk, and the node keeps them in memory and on
// tmpfs.

// credentialProviderName is the provider's executable in the bin
// directory: the kube binary, which runs its credential-provider tool
// under this name.
const credentialProviderName = "kube-credential-provider"

// credentialCacheDuration is how long the kubelet keeps a provider's
// answer: a changed password reaches pulls within it.
const credentialCacheDuration = "1m"

// known passes a policy the curator sent (nil: none yet, and a worker
// cannot tell which registries need credentials).
var known = event.Filter(func(cfg *clusterpb.ClusterConfiguration) bool { return cfg != nil })

// registriesOf is the policy's image registries (none without a policy).
func registriesOf(cfg *clusterpb.ClusterConfiguration) []*clusterpb.ImageRegistry {
	return cfg.GetKubernetes().GetImageRegistries()
}

// credentialHosts are the registries with credentials, sorted: what the
// kubelet's provider configuration matches.
func credentialHosts(regs []*clusterpb.ImageRegistry) []string {
	var hosts []string
	for _, r := range regs {
		if r.GetUsername() != "" {
			hosts = append(hosts, r.GetHost())
		}
	}
	slices.Sort(hosts)
	return hosts
}

// registryServer is where containerd finds a registry itself when no
// mirror serves a pull (Docker Hub's API is not at docker.io).
func registryServer(host string) string {
	if host == "docker.io" {
		return "https://registry-1.docker.io"
	}
	return "https://" + host
}

// hostsTOML is containerd's hosts.toml for r: the registry as server,
// each mirror as a host tried first (pull and resolve), the CA file (if
// any) trusted for all of them that speak HTTPS.
func hostsTOML(r *clusterpb.ImageRegistry, caFile string) []byte {
	var b strings.Builder
	ca := ""
	if caFile != "" {
		ca = fmt.Sprintf("ca = [%q]\n", caFile)
	}
	fmt.Fprintf(&b, "# From the cluster policy (plinthctl cluster policy --registry %s); rewritten by the node.\n", r.GetHost())
	fmt.Fprintf(&b, "server = %q\n%s", registryServer(r.GetHost()), ca)
	for _, m := range r.GetMirrors() {
		fmt.Fprintf(&b, "\n[host.%q]\n  capabilities = [\"pull\", \"resolve\"]\n", m)
		// A CA on an http:// mirror would make containerd try HTTPS
		// there first.
		if ca != "" && strings.HasPrefix(m, "https://") {
			b.WriteString("  " + ca)
		}
	}
	return []byte(b.String())
}

// registryCredentials is the credentials file the provider answers from:
// registry host → basic-auth credentials.
type registryCredentials map[string]struct {
	Username string `json:"username"`
	Password string `json:"password"`
}

// credentialsJSON is the credentials file's content for regs.
func credentialsJSON(regs []*clusterpb.ImageRegistry) []byte {
	c := registryCredentials{}
	for _, r := range regs {
		if r.GetUsername() != "" {
			c[r.GetHost()] = struct {
				Username string `json:"username"`
				Password string `json:"password"`
			}{r.GetUsername(), r.GetPassword()}
		}
	}
	return mustJSON(c)
}

// credentialProviderConfig is the kubelet's CredentialProviderConfig
// (kubelet.config.k8s.io/v1) for hosts, answering from credFile.
func credentialProviderConfig(hosts []string, credFile string) []byte {
	return mustJSON(map[string]any{
		"apiVersion": "kubelet.config.k8s.io/v1",
		"kind":       "CredentialProviderConfig",
		"providers": []map[string]any{{
			"name":                 credentialProviderName,
			"apiVersion":           "credentialprovider.kubelet.k8s.io/v1",
			"matchImages":          hosts,
			"defaultCacheDuration": credentialCacheDuration,
			"args":                 []string{"-file", credFile},
		}},
	})
}

// writeRegistries writes containerd's hosts directory and the
// credentials file for regs: every registry's directory replaced, those
// no longer in the policy removed. Each file is written whole (a
// temporary file renamed), so containerd and the provider never read
// half of one.
func writeRegistries(r *localstorage.EphemeralDirectory, regs []*clusterpb.ImageRegistry) error {
	hostsDir := r.Containerd.Hosts.Path()
	if err := os.MkdirAll(hostsDir, 0o700); err != nil {
		return err
	}
	want := map[string]bool{}
	for _, reg := range regs {
		dir := filepath.Join(hostsDir, reg.GetHost())
		want[reg.GetHost()] = true
		if err := os.MkdirAll(dir, 0o700); err != nil {
			return err
		}
		caFile := ""
		if reg.GetCaCertificates() != "" {
			caFile = filepath.Join(dir, "ca.pem")
			if err := writeFileAtomic(caFile, []byte(reg.GetCaCertificates()), 0o644); err != nil {
				return err
			}
		} else if err := os.Remove(filepath.Join(dir, "ca.pem")); err != nil && !os.IsNotExist(err) {
			return err
		}
		if err := writeFileAtomic(filepath.Join(dir, "hosts.toml"), hostsTOML(reg, caFile), 0o644); err != nil {
			return err
		}
	}
	entries, err := os.ReadDir(hostsDir)
	if err != nil {
		return err
	}
	for _, e := range entries {
		if !want[e.Name()] {
			if err := os.RemoveAll(filepath.Join(hostsDir, e.Name())); err != nil {
				return err
			}
		}
	}
	if err := os.MkdirAll(r.Kubernetes.Registries.Path(), 0o700); err != nil {
		return err
	}
	return writeFileAtomic(r.Kubernetes.Registries.Credentials.Path(), credentialsJSON(regs), 0o600)
}

// writeFileAtomic writes path through a temporary file in its directory.
func writeFileAtomic(path string, data []byte, mode os.FileMode) error {
	tmp := path + ".new"
	if err := os.WriteFile(tmp, data, mode); err != nil {
		return err
	}
	return os.Rename(tmp, path)
}

// followRegistries is the worker's registries runnable: it writes the
// registries of every policy it sees until ctx ends.
func followRegistries(root *localstorage.EphemeralDirectory, policy event.Value[*clusterpb.ClusterConfiguration]) supervisor.Runnable {
	return func(ctx context.Context) error {
		w := policy.Watch()
		defer w.Close()
		log := supervisor.Logger(ctx)
		for first := true; ; first = false {
			cfg, err := w.Get(ctx, known)
			if err != nil {
				return err
			}
			regs := registriesOf(cfg)
			if err := writeRegistries(root, regs); err != nil {
				return fmt.Errorf("writing the image registries' configuration: %w", err)
			}
			hosts := make([]string, len(regs))
			for i, r := range regs {
				hosts[i] = r.GetHost()
			}
			log.Info("image registries configured", "registries", strings.Join(hosts, " "), "with credentials", strings.Join(credentialHosts(regs), " "))
			if first {
				supervisor.Signal(ctx, supervisor.SignalHealthy)
			}
		}
	}
}

// kubeletWithRegistries runs the kubelet (args: kubeletArgs) with the
// credential provider for the policy's registries with credentials, if
// any, and restarts it when that set changes. Without a policy (tests)
// it runs the kubelet as it is.
func kubeletWithRegistries(root *localstorage.EphemeralDirectory, policy event.Value[*clusterpb.ClusterConfiguration], args []string) supervisor.Runnable {
	return func(ctx context.Context) error {
		if policy == nil {
			return kubeCommand(supervisor.Command{Args: args, Cgroup: runtimeCgroup})(ctx)
		}
		w := policy.Watch()
		defer w.Close()
		cfg, err := w.Get(ctx, known)
		if err != nil {
			return err
		}
		hosts := credentialHosts(registriesOf(cfg))
		if len(hosts) > 0 {
			reg := root.Kubernetes.Registries
			if err := os.MkdirAll(reg.Bin.Path(), 0o700); err != nil {
				return err
			}
			link := filepath.Join(reg.Bin.Path(), credentialProviderName)
			if err := os.Remove(link); err != nil && !os.IsNotExist(err) {
				return err
			}
			if err := os.Symlink(layout.KubeBinary, link); err != nil {
				return err
			}
			if err := writeFileAtomic(reg.ProviderConfig.Path(), credentialProviderConfig(hosts, reg.Credentials.Path()), 0o600); err != nil {
				return err
			}
			args = append(slices.Clip(args), "--image-credential-provider-config="+reg.ProviderConfig.Path(),
				"--image-credential-provider-bin-dir="+reg.Bin.Path())
		}
		kctx, cancel := context.WithCancel(ctx)
		defer cancel()
		changed := make(chan []string, 1)
		go func() {
			for {
				cfg, err := w.Get(kctx, known)
				if err != nil {
					return
				}
				if now := credentialHosts(registriesOf(cfg)); !slices.Equal(now, hosts) {
					changed <- now
					cancel()
					return
				}
			}
		}()
		err = kubeCommand(supervisor.Command{Args: args, Cgroup: runtimeCgroup})(kctx)
		select {
		case now := <-changed:
			supervisor.Logger(ctx).Info("restarting the kubelet: the registries with credentials changed", "were", strings.Join(hosts, " "), "now", strings.Join(now, " "))
			return fmt.Errorf("the registries with credentials changed: %w", supervisor.ErrRestart)
		default:
			return err
		}
	}
}
