package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/spf13/pflag"

	"plinth.dev/plinth/platform/atomicfile"
	"plinth.dev/plinth/platform/pki"
	"plinth.dev/plinth/roleserver/owner"
)

func init() {
	add(spec{path: "cluster kubeconfig", short: "Write a kubeconfig for kubectl (short-lived certificates through plinthctl kubernetes-credential)",
		long: "Write a kubeconfig for kubectl to standard output, or to --file. It holds no key: kubectl\n" +
			"runs plinthctl kubernetes-credential for a one-hour certificate when it needs one.\n" +
			"--revoke-all ends every Kubernetes certificate the owner was issued so far, and writes nothing.",
		maxArgs: 0, new: func() command { return new(kubeconfigCmd) }})
}

// kubeconfigCmd is `plinthctl cluster kubeconfig [--server
// https://HOST:PORT] [--file FILE] [--wait D]` and `plinthctl cluster
// kubeconfig --revoke-all`: a kubeconfig for a stock kubectl, JSON
// (which kubectl reads as YAML), with
//
//	cluster plinth  server: --server, else the first API server the cluster names
//	                certificate-authority-data: the Kubernetes CA
//	                tls-server-name: kubernetes.default.svc
//	user plinth-owner  exec: plinthctl kubernetes-credential --config DIR
//
// tls-server-name is a name in every API server's certificate, so the
// server verifies under any address it is reached at: a forwarded
// loopback port, or another of its addresses. The user holds no key: the
// credential plugin gets a one-hour certificate when kubectl needs one.
// Writing the kubeconfig also fetches the first (and caches it).
//
// The kubeconfig is written only for a cluster that has a Kubernetes
// controller; then plinthctl asks the API server's /readyz whether it
// serves, so that a user is told "not serving yet" instead of meeting a
// reset connection in kubectl. --wait waits for it (a node starting
// Kubernetes under TCG takes a minute or two).
//
// --revoke-all ends every Kubernetes certificate the owner was issued so
// far (the cluster moves the owner's credential epoch; cluster-admin is
// bound to the new epoch's group alone) and drops the cached one; the
// kubeconfigs written before keep working, with new certificates.
type kubeconfigCmd struct {
	fs        *pflag.FlagSet
	server    string
	file      string
	wait      time.Duration
	revokeAll bool
}

// kubeTLSServerName is what kubectl checks the API server's certificate
// for (see roleserver/kubernetes/pki: every API server has it).
const kubeTLSServerName = "kubernetes.default.svc"

// Names in the kubeconfig.
const (
	kubeconfigClusterName = "plinth"
	kubeconfigUserName    = "plinth-owner"
	kubeconfigContextName = "plinth"
)

// kubeconfig is the part of a clientcmd v1 Config written here (small
// local types: k8s.io/client-go is not linked for this).
type kubeconfig struct {
	APIVersion     string              `json:"apiVersion"`
	Kind           string              `json:"kind"`
	Clusters       []kubeconfigCluster `json:"clusters"`
	Users          []kubeconfigUser    `json:"users"`
	Contexts       []kubeconfigContext `json:"contexts"`
	CurrentContext string              `json:"current-context"`
}

type kubeconfigCluster struct {
	Name    string `json:"name"`
	Cluster struct {
		Server string `json:"server"`
		// CertificateAuthorityData is PEM; JSON base64-encodes []byte,
		// as the kubeconfig format wants.
		CertificateAuthorityData []byte `json:"certificate-authority-data"`
		TLSServerName            string `json:"tls-server-name"`
	} `json:"cluster"`
}

type kubeconfigUser struct {
	Name string `json:"name"`
	User struct {
		Exec kubeconfigExec `json:"exec"`
	} `json:"user"`
}

type kubeconfigExec struct {
	APIVersion         string   `json:"apiVersion"`
	Command            string   `json:"command"`
	Args               []string `json:"args"`
	InteractiveMode    string   `json:"interactiveMode"`
	ProvideClusterInfo bool     `json:"provideClusterInfo"`
	InstallHint        string   `json:"installHint,omitempty"`
}

type kubeconfigContext struct {
	Name    string `json:"name"`
	Context struct {
		Cluster string `json:"cluster"`
		User    string `json:"user"`
	} `json:"context"`
}

func (c *kubeconfigCmd) flags(fs *pflag.FlagSet) {
	c.fs = fs
	fs.StringVar(&c.server, "server", "", "the API server's `URL` (default: https:// the first controller's address, port 6443), e.g. a forwarded https://127.0.0.1:PORT")
	fs.StringVar(&c.file, "file", "", "write the kubeconfig to `file` (replaced whole, mode 0600) instead of standard output")
	fs.DurationVar(&c.wait, "wait", 0, "wait up to `duration` for the API server to serve (default: check once, and fail if it does not serve yet)")
	fs.BoolVar(&c.revokeAll, "revoke-all", false, "revoke every Kubernetes certificate issued to the owner so far (a stolen one among them), and write nothing")
}

func (c *kubeconfigCmd) run(ctx context.Context, e *env, _ []string) error {
	stdout, stderr := e.stdout, e.stderr
	if c.revokeAll {
		for _, f := range []string{"server", "file", "wait"} {
			if c.fs.Changed(f) {
				return usagef("--revoke-all writes no kubeconfig: give it without --%s", f)
			}
		}
		return c.revoke(ctx, e)
	}
	if c.server != "" {
		if u, err := url.Parse(c.server); err != nil || u.Scheme != "https" || u.Host == "" {
			return usagef("--server %q: want https://HOST:PORT", c.server)
		}
	}
	dir, err := filepath.Abs(e.config)
	if err != nil {
		return err
	}
	self, err := credentialPlugin()
	if err != nil {
		return err
	}
	issued, server, err := c.credential(ctx, e, dir)
	if err != nil {
		return err
	}
	b, err := json.MarshalIndent(newKubeconfig(server, pki.CertificatePEM(issued.kc.CA), self, dir), "", "  ")
	if err != nil {
		return err
	}
	b = append(b, '\n')
	if c.file == "" {
		if _, err = stdout.Write(b); err != nil {
			return err
		}
	} else if err := atomicfile.Write(c.file, b, 0o600); err != nil {
		return err
	}
	u, _ := url.Parse(server)
	if err := waitServing(ctx, owner.NewKubeAPI(issued.kc, issued.key, u.Host), c.wait, stderr); err != nil {
		if c.file != "" {
			return fmt.Errorf("wrote %s, but %w", c.file, err)
		}
		return err
	}
	if c.file != "" {
		fmt.Fprintf(stderr, "plinthctl: wrote %s (server %s, serving); try: kubectl --kubeconfig %s get nodes\n", c.file, server, c.file)
	}
	return nil
}

// credential checks that the cluster has a Kubernetes controller and gets
// (and caches in dir, the absolute --config) the owner's first
// Kubernetes credential; server is --server, or else the first API
// server the cluster names.
func (c *kubeconfigCmd) credential(ctx context.Context, e *env, dir string) (issued *issuedCredential, server string, err error) {
	cl, err := e.dial()
	if err != nil {
		return nil, "", err
	}
	defer cl.Close()
	ctx, cancel := context.WithTimeout(ctx, callTimeout)
	defer cancel()
	if err := hasController(ctx, cl); err != nil {
		return nil, "", err
	}
	if issued, err = newKubeCredential(ctx, cl, dir); err != nil {
		return nil, "", err
	}
	if server = c.server; server == "" {
		if len(issued.kc.APIServers) == 0 {
			return nil, "", errNoAPIServer
		}
		server = "https://" + issued.kc.APIServers[0]
	}
	return issued, server, nil
}

// newKubeconfig is the kubeconfig of the package comment: the cluster at
// server with CA caPEM, and the owner as a user whose credential plugin is
// self (plinthctl kubernetes-credential --config dir).
func newKubeconfig(server string, caPEM []byte, self, dir string) kubeconfig {
	cfg := kubeconfig{APIVersion: "v1", Kind: "Config", CurrentContext: kubeconfigContextName}
	var cluster kubeconfigCluster
	cluster.Name = kubeconfigClusterName
	cluster.Cluster.Server = server
	cluster.Cluster.CertificateAuthorityData = caPEM
	cluster.Cluster.TLSServerName = kubeTLSServerName
	var user kubeconfigUser
	user.Name = kubeconfigUserName
	user.User.Exec = kubeconfigExec{
		APIVersion:      execCredentialAPIVersion,
		Command:         self,
		Args:            []string{"kubernetes-credential", "--config", dir},
		InteractiveMode: "Never",
		InstallHint:     "plinthctl (the Plinth owner tool) is not where it was when it wrote this kubeconfig: run plinthctl cluster kubeconfig again",
	}
	var kctx kubeconfigContext
	kctx.Name = kubeconfigContextName
	kctx.Context.Cluster, kctx.Context.User = kubeconfigClusterName, kubeconfigUserName
	cfg.Clusters, cfg.Users, cfg.Contexts = []kubeconfigCluster{cluster}, []kubeconfigUser{user}, []kubeconfigContext{kctx}
	return cfg
}

// revoke moves the owner's credential epoch and drops the cached
// credential of the old one.
func (c *kubeconfigCmd) revoke(ctx context.Context, e *env) error {
	cl, ctx, done, err := e.call(ctx)
	if err != nil {
		return err
	}
	defer done()
	epoch, err := cl.RevokeKubernetesCredentials(ctx)
	if err != nil {
		return err
	}
	if err := os.Remove(filepath.Join(e.config, kubeCredentialFile)); err != nil && !errors.Is(err, os.ErrNotExist) {
		return err
	}
	fmt.Fprintf(e.stderr, "plinthctl: every Kubernetes certificate issued to the owner before is revoked (owner credentials now of epoch %d); kubectl gets a new one when it next runs\n", epoch)
	return nil
}

// credentialPlugin is the plinthctl the kubeconfig names as kubectl's
// credential plugin: this executable, unless `go run` built it into a
// directory that goes away when it exits.
func credentialPlugin() (string, error) {
	self, err := os.Executable()
	if err != nil {
		return "", fmt.Errorf("finding plinthctl itself for the credential plugin: %w", err)
	}
	// go run links into $TMPDIR/go-build…/b001/exe/ and removes it after.
	if strings.Contains(self, string(filepath.Separator)+"go-build") && filepath.Base(filepath.Dir(self)) == "exe" {
		return "", fmt.Errorf("plinthctl runs from a temporary `go run` build (%s), which the kubeconfig could not name as kubectl's credential plugin: build it (make tools: out/bin/plinthctl) and run that", self)
	}
	return self, nil
}

// errNoController is returned by cluster kubeconfig for a cluster without a
// Kubernetes controller: an API server is never going to answer.
var errNoController = errors.New("this cluster has no node with the KubernetesController role, so nothing serves the Kubernetes API: give one that role with plinthctl role add NODE kubernetes-controller kubernetes-worker")

// hasController checks that some node of the cluster has the
// KubernetesController role.
func hasController(ctx context.Context, cl *owner.Client) error {
	nodes, err := cl.Nodes(ctx)
	if err != nil {
		return err
	}
	for _, n := range nodes {
		if n.GetRoles().GetKubernetesController() != nil {
			return nil
		}
	}
	return errNoController
}

// kubeWaitProgress is how often --wait says it is still waiting.
const kubeWaitProgress = 20 * time.Second

// waitServing checks that api serves, for up to wait, saying every
// kubeWaitProgress that it waits.
func waitServing(ctx context.Context, api *owner.KubeAPI, wait time.Duration, stderr io.Writer) error {
	server := api.Server
	start := time.Now()
	next := start.Add(kubeWaitProgress)
	for {
		err := api.Ready(ctx)
		if !errors.Is(err, owner.ErrAPINotServing) {
			return err
		}
		if time.Since(start) >= wait {
			return fmt.Errorf("%w: the node is still starting Kubernetes (under TCG its API server serves a minute or two after power-on); kubectl works once it does, or run this with --wait 10m", err)
		}
		if time.Now().After(next) {
			fmt.Fprintf(stderr, "plinthctl: waiting for the API server at %s (%s): the node is still starting Kubernetes\n", server, time.Since(start).Round(time.Second))
			next = next.Add(kubeWaitProgress)
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(2 * time.Second):
		}
	}
}
