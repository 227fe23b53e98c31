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
	"fmt"
	"io"
	"os"
	"path/filepath"
	"time"

	"plinth.dev/plinth/platform/atomicfile"
	"plinth.dev/plinth/platform/pki"
	"plinth.dev/plinth/roleserver/owner"
)

func init() {
	register("kubernetes-credential", "print kubectl's client certificate as an ExecCredential (the credential plugin of plinthctl kubeconfig)",
		func() verb { return new(kubeCredentialCmd) })
}

// kubeCredentialCmd is `plinthctl kubernetes-credential [-config DIR]`,
// the client-go credential plugin named in the kubeconfig that plinthctl
// kubeconfig writes. It prints a client.authentication.k8s.io/v1
// ExecCredential with a client certificate for a Kubernetes
// administrator:
//
//	kubectl ──exec──► plinthctl kubernetes-credential
//	                    cache in DIR valid for 5 more minutes? ──► print it
//	                    else: new ECDSA P-256 key ──Management.IssueKubernetesCredentials──►
//	                          certificate (1 hour) ──► DIR/kubernetes-credential.json (0600) ──► print
//
// The certificate lasts an hour and Kubernetes cannot revoke it, so
// nothing long-lived sits in the kubeconfig or the cache; the owner
// certificate in DIR is what lets plinthctl ask for a new one.
type kubeCredentialCmd struct {
	config string
}

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

func (c *kubeCredentialCmd) run(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs := newFlagSet("kubernetes-credential", stderr)
	configFlagVar(fs, &c.config)
	if err := noArgs(fs, args); err != nil {
		return err
	}
	cred, ok := cachedKubeCredential(c.config, time.Now())
	if !ok {
		cl, err := dialOwner(c.config)
		if err != nil {
			return err
		}
		defer cl.Close()
		ctx, cancel := context.WithTimeout(ctx, callTimeout)
		defer cancel()
		issued, err := newKubeCredential(ctx, cl, c.config)
		if err != nil {
			return err
		}
		cred = issued.exec
	}
	b, err := json.MarshalIndent(cred, "", "  ")
	if err != nil {
		return err
	}
	_, err = stdout.Write(append(b, '\n'))
	return err
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

// errNoAPIServer is returned by kubeconfig when no API server is known.
var errNoAPIServer = errors.New("the cluster has no UP node with the KubernetesController role yet; pass -server https://HOST:PORT")
