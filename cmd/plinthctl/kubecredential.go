package main

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"encoding/pem"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"time"

	"github.com/spf13/pflag"

	"plinth.dev/plinth/platform/atomicfile"
	"plinth.dev/plinth/platform/pki"
	"plinth.dev/plinth/roleserver/owner"
)

func init() {
	add(spec{path: "kubernetes-credential", args: "[--config DIR]",
		short:   "Print kubectl's client certificate as an ExecCredential (the credential plugin of plinthctl cluster kubeconfig)",
		maxArgs: -1, hidden: true, rawArgs: true, group: groupOther, new: func() command { return new(kubeCredentialCmd) }})
}

// kubeCredentialCmd is `plinthctl kubernetes-credential [--config DIR]`,
// the client-go credential plugin named in the kubeconfig that plinthctl
// cluster kubeconfig writes. It prints a client.authentication.k8s.io/v1
// ExecCredential with a client certificate for a Kubernetes
// administrator, and nothing else on standard output:
//
//	kubectl ──exec──► plinthctl kubernetes-credential
//	                    cache in DIR valid for 5 more minutes? ──► print it
//	                    else: new ECDSA P-256 key ──Management.IssueKubernetesCredentials──►
//	                          certificate (1 hour) ──► DIR/kubernetes-credential.json (0600) ──► print
//
// The certificate lasts an hour and Kubernetes cannot revoke it, so
// nothing long-lived sits in the kubeconfig or the cache; the owner
// certificate in DIR is what lets plinthctl ask for a new one.
//
// Its arguments are what kubeconfigs name, and kubeconfigs outlive
// plinthctl versions: they are parsed with the standard flag package
// (spec.rawArgs), which takes -config DIR as well as --config DIR.
type kubeCredentialCmd struct{}

// Credential plugin protocol constants.
const (
	execCredentialAPIVersion = "client.authentication.k8s.io/v1"
	// kubeCredentialFile caches the last ExecCredential in the
	// configuration dir.
	kubeCredentialFile = "kubernetes-credential.json"
	// kubeCredentialRenewBefore: a cached credential is used only while it
	// stays valid this much longer, so a kubectl command that starts with
	// it does not see it expire midway.
	kubeCredentialRenewBefore = 5 * time.Minute
)

// execCredential is client.authentication.k8s.io/v1 ExecCredential, the
// part of it a plugin writes (k8s.io/client-go is not linked for this).
type execCredential struct {
	APIVersion string                `json:"apiVersion"`
	Kind       string                `json:"kind"`
	Spec       execCredentialSpec    `json:"spec"`
	Status     *execCredentialStatus `json:"status"`
}

type execCredentialSpec struct {
	Interactive bool `json:"interactive"`
}

type execCredentialStatus struct {
	// ExpirationTimestamp is RFC 3339: client-go runs the plugin again
	// after it.
	ExpirationTimestamp   string `json:"expirationTimestamp"`
	ClientCertificateData string `json:"clientCertificateData"` // PEM
	ClientKeyData         string `json:"clientKeyData"`         // PEM
}

func (c *kubeCredentialCmd) flags(*pflag.FlagSet) {}

func (c *kubeCredentialCmd) run(ctx context.Context, e *env, args []string) error {
	if help, err := parseCredentialArgs(e, args); help || err != nil {
		return err
	}
	cred, ok := cachedKubeCredential(e.config, time.Now())
	if !ok {
		cl, err := e.dial()
		if err != nil {
			return err
		}
		defer cl.Close()
		ctx, cancel := context.WithTimeout(ctx, callTimeout)
		defer cancel()
		issued, err := newKubeCredential(ctx, cl, e.config)
		if err != nil {
			return err
		}
		cred = issued.exec
	}
	b, err := json.MarshalIndent(cred, "", "  ")
	if err != nil {
		return err
	}
	_, err = e.stdout.Write(append(b, '\n'))
	return err
}

// parseCredentialArgs sets e's --config and --endpoint from args, in
// either spelling (-config or --config); anything else is wrong usage.
// help reports that args asked for help, which it printed.
func parseCredentialArgs(e *env, args []string) (help bool, err error) {
	fs := flag.NewFlagSet("kubernetes-credential", flag.ContinueOnError)
	fs.SetOutput(io.Discard)
	fs.StringVar(&e.config, "config", e.config, "owner configuration `dir`")
	var endpoints listFlag
	fs.Var(&endpoints, "endpoint", "curator `host:port`")
	if err := fs.Parse(args); errors.Is(err, flag.ErrHelp) {
		fmt.Fprintln(e.stderr, "usage: plinthctl kubernetes-credential [--config DIR]: kubectl's credential plugin, named in the kubeconfigs plinthctl cluster kubeconfig writes")
		return true, nil
	} else if err != nil {
		return false, usagef("%v", err)
	}
	if fs.NArg() > 0 {
		return false, usagef("unexpected arguments %q", fs.Args())
	}
	if len(endpoints) > 0 {
		e.endpoints = endpoints
	}
	return false, nil
}

// issuedCredential is a credential newKubeCredential had issued: as
// kubectl gets it, as the cluster answered, and its key.
type issuedCredential struct {
	exec *execCredential
	kc   *owner.KubernetesCredentials
	key  *ecdsa.PrivateKey
}

// newKubeCredential generates a key, has the cluster certify it and
// caches the result in dir.
func newKubeCredential(ctx context.Context, cl *owner.Client, dir string) (*issuedCredential, error) {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, err
	}
	kc, err := cl.KubernetesCredentials(ctx, key.Public())
	if err != nil {
		return nil, fmt.Errorf("asking the cluster for Kubernetes credentials: %w", err)
	}
	der, err := x509.MarshalPKCS8PrivateKey(key)
	if err != nil {
		return nil, err
	}
	cred := &execCredential{
		APIVersion: execCredentialAPIVersion,
		Kind:       "ExecCredential",
		Status: &execCredentialStatus{
			// Truncated to the second: never later than the certificate.
			ExpirationTimestamp:   kc.Expires.UTC().Format(time.RFC3339),
			ClientCertificateData: string(pki.CertificatePEM(kc.Certificate)),
			ClientKeyData:         string(pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: der})),
		},
	}
	b, err := json.Marshal(cred)
	if err != nil {
		return nil, err
	}
	// A failed cache write costs only a new certificate next time.
	_ = atomicfile.Write(filepath.Join(dir, kubeCredentialFile), b, 0o600)
	return &issuedCredential{exec: cred, kc: kc, key: key}, nil
}

// cachedKubeCredential returns the cached credential if it is whole and
// stays valid for kubeCredentialRenewBefore after now.
func cachedKubeCredential(dir string, now time.Time) (*execCredential, bool) {
	b, err := os.ReadFile(filepath.Join(dir, kubeCredentialFile))
	if err != nil {
		return nil, false
	}
	var cred execCredential
	if json.Unmarshal(b, &cred) != nil || cred.APIVersion != execCredentialAPIVersion || cred.Status == nil {
		return nil, false
	}
	exp, err := time.Parse(time.RFC3339, cred.Status.ExpirationTimestamp)
	if err != nil || exp.Sub(now) < kubeCredentialRenewBefore {
		return nil, false
	}
	pair, err := tls.X509KeyPair([]byte(cred.Status.ClientCertificateData), []byte(cred.Status.ClientKeyData))
	if err != nil || pair.Leaf == nil || pair.Leaf.NotAfter.Sub(now) < kubeCredentialRenewBefore {
		return nil, false
	}
	return &cred, true
}

// errNoAPIServer is returned by cluster kubeconfig when no API server is
// known.
var errNoAPIServer = errors.New("the cluster has no UP node with the KubernetesController role yet; pass --server https://HOST:PORT")
