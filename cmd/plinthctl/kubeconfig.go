package main

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/url"
	"os"
	"path/filepath"

	"plinth.dev/plinth/platform/atomicfile"
	"plinth.dev/plinth/platform/pki"
)

func init() {
	register("kubeconfig", "write a kubeconfig for kubectl (short-lived certificates through plinthctl kubernetes-credential)",
		func() verb { return new(kubeconfigCmd) })
}

// kubeconfigCmd is `plinthctl kubeconfig [-config DIR] [-server
// https://HOST:PORT] [-o FILE]`: a kubeconfig for a stock kubectl, JSON
// (which kubectl reads as YAML), with
//
//	cluster plinth  server: -server, else the first API server the cluster names
//	                certificate-authority-data: the Kubernetes CA
//	                tls-server-name: kubernetes.default.svc
//	user plinth-owner  exec: plinthctl kubernetes-credential -config DIR
//
// tls-server-name is a name in every API server's certificate, so the
// server verifies under any address it is reached at: a forwarded
// loopback port, or another of its addresses. The user holds no key: the
// credential plugin gets a one-hour certificate when kubectl needs one.
// Writing the kubeconfig also fetches the first (and caches it).
type kubeconfigCmd struct {
	config string
	server string
	out    string
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

func (c *kubeconfigCmd) run(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs := newFlagSet("kubeconfig", stderr)
	configFlagVar(fs, &c.config)
	fs.StringVar(&c.server, "server", "", "the API server's `URL` (default: https:// the first controller's address, port 6443), e.g. a forwarded https://127.0.0.1:PORT")
	fs.StringVar(&c.out, "o", "", "write the kubeconfig to `file` (replaced whole, mode 0600) instead of standard output")
	if err := noArgs(fs, args); err != nil {
		return err
	}
	if c.server != "" {
		if u, err := url.Parse(c.server); err != nil || u.Scheme != "https" || u.Host == "" {
			return fmt.Errorf("-server %q: want https://HOST:PORT", c.server)
		}
	}
	dir, err := filepath.Abs(c.config)
	if err != nil {
		return err
	}
	self, err := os.Executable()
	if err != nil {
		return fmt.Errorf("finding plinthctl itself for the credential plugin: %w", err)
	}
	cl, err := dialOwner(dir)
	if err != nil {
		return err
	}
	defer cl.Close()
	ctx, cancel := context.WithTimeout(ctx, callTimeout)
	defer cancel()
	_, kc, err := newKubeCredential(ctx, cl, dir)
	if err != nil {
		return err
	}
	server := c.server
	if server == "" {
		if len(kc.APIServers) == 0 {
			return errNoAPIServer
		}
		server = "https://" + kc.APIServers[0]
	}

	cfg := kubeconfig{APIVersion: "v1", Kind: "Config", CurrentContext: kubeconfigContextName}
	var cluster kubeconfigCluster
	cluster.Name = kubeconfigClusterName
	cluster.Cluster.Server = server
	cluster.Cluster.CertificateAuthorityData = pki.CertificatePEM(kc.CA)
	cluster.Cluster.TLSServerName = kubeTLSServerName
	var user kubeconfigUser
	user.Name = kubeconfigUserName
	user.User.Exec = kubeconfigExec{
		APIVersion:      execCredentialAPIVersion,
		Command:         self,
		Args:            []string{"kubernetes-credential", "-config", dir},
		InteractiveMode: "Never",
		InstallHint:     "plinthctl (the Plinth owner tool) is not where it was when it wrote this kubeconfig: run plinthctl kubeconfig again",
	}
	var kctx kubeconfigContext
	kctx.Name = kubeconfigContextName
	kctx.Context.Cluster, kctx.Context.User = kubeconfigClusterName, kubeconfigUserName
	cfg.Clusters, cfg.Users, cfg.Contexts = []kubeconfigCluster{cluster}, []kubeconfigUser{user}, []kubeconfigContext{kctx}
	b, err := json.MarshalIndent(cfg, "", "  ")
	if err != nil {
		return err
	}
	b = append(b, '\n')
	if c.out == "" {
		_, err = stdout.Write(b)
		return err
	}
	if err := atomicfile.Write(c.out, b, 0o600); err != nil {
		return err
	}
	fmt.Fprintf(stderr, "plinthctl: wrote %s (server %s); try: KUBECONFIG=%s kubectl get nodes\n", c.out, server, c.out)
	return nil
}
