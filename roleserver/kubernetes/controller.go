package kubernetes

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"net"
	"net/http"
	"sync"
	"time"

	"plinth.dev/plinth/platform/event/memory"
	"plinth.dev/plinth/platform/layout"
	"plinth.dev/plinth/platform/supervisor"
	"plinth.dev/plinth/roleserver/consensus"
	"plinth.dev/plinth/roleserver/kubernetes/pki"
	"plinth.dev/plinth/roleserver/localstorage"
)

// Status is what a running control plane offers the rest of the node
// (the seed's KubernetesStatus): set once the local API server serves.
type Status struct {
	// APIServer is the local API server's URL.
	APIServer string
	// CACertificate is the Kubernetes CA, PEM.
	CACertificate []byte
}

// Controller runs the Kubernetes control plane of a node with the
// KubernetesController role (always also a consensus member):
//
//	consensus.ServeKubernetes ── etcd.sock (only /kubernetes/)
//	kube apiserver             ── :6443, etcd.sock, PKI from etcd (curator namespace)
//	kube controller-manager    ── allocates pod CIDRs
//	kube scheduler
//	rbac                       ── the roles Plinth's worker components need
//
// Each is a child runnable (a child process where it is a program), so
// the supervisor restarts it with backoff and counts its crashes.
type Controller struct {
	Root   *localstorage.Root
	NodeID string
	// Address is the node's address the API server advertises.
	Address net.IP
	// Consensus is the node's running etcd member.
	Consensus *consensus.Status
	// Status is set when the API server serves, and cleared when it
	// stops.
	Status *memory.Value[*Status]
	// KubeBinary is the multi-call Kubernetes binary; default
	// layout.KubeBinary (tests run the control plane on the host).
	KubeBinary string
}

// Run is a supervisor runnable.
func (c *Controller) Run(ctx context.Context) error {
	log := supervisor.Logger(ctx)
	kv, err := c.Consensus.CuratorClient()
	if err != nil {
		return err
	}
	defer kv.Close()
	issued := time.Now()
	creds, err := pki.New(kv).Controller(ctx, c.NodeID, []net.IP{c.Address})
	if err != nil {
		return fmt.Errorf("control plane credentials: %w", err)
	}
	dir := c.Root.Ephemeral.Kubernetes.Controller.Path()
	f, err := controllerFiles(creds).write(dir)
	if err != nil {
		return err
	}
	etcdSock := c.Root.Ephemeral.Kubernetes.EtcdSocket.Path()
	served, ready := servedOnce(apiReady(apiServerLocalEndpoint, creds.CACertificate))
	// The API server first: under TCG its start takes minutes of CPU,
	// and the controller manager and scheduler only crash-loop (with a
	// growing backoff) until it serves and its default roles exist.
	if err := runAll(ctx, []named{
		{"etcd", func(ctx context.Context) error {
			supervisor.Signal(ctx, supervisor.SignalHealthy)
			return c.Consensus.ServeKubernetes(ctx, etcdSock)
		}},
		{"apiserver", command(c.KubeBinary, apiserverArgs(f, c.Address, etcdSock), ready)},
	}); err != nil {
		return err
	}
	defer c.Status.Set(nil)
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-served:
	}
	if err := runAll(ctx, []named{
		{"rbac", applyRBAC(pki.New(kv), c.NodeID, apiServerLocalEndpoint)},
		{"controller-manager", command(c.KubeBinary, controllerManagerArgs(f, c.Root.Ephemeral.Kubernetes.VolumePlugins.Path()), nil)},
		{"scheduler", command(c.KubeBinary, schedulerArgs(f), nil)},
	}); err != nil {
		return err
	}
	log.Info("Kubernetes API server serving", "address", apiServerLocalEndpoint)
	c.Status.Set(&Status{APIServer: apiServerLocalEndpoint, CACertificate: creds.CACertificate})
	supervisor.Signal(ctx, supervisor.SignalHealthy)
	// New credentials at two thirds of their life: a restart issues them
	// (from etcd, which this node serves: nothing to wait for).
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-time.After(time.Until(pki.RenewAt(issued, creds.NotAfter))):
		return fmt.Errorf("renewing the control plane's certificates (valid until %v): %w", creds.NotAfter, supervisor.ErrRestart)
	}
}

// controllerFiles are the control plane's files.
func controllerFiles(c *pki.ControllerCredentials) files {
	return files{
		fileCA:                c.CACertificate,
		fileFrontProxyCA:      c.FrontProxyCACertificate,
		fileAPIServerCert:     c.APIServer.Certificate,
		fileAPIServerKey:      c.APIServer.Key,
		fileKubeletClientCert: c.KubeletClient.Certificate,
		fileKubeletClientKey:  c.KubeletClient.Key,
		fileFrontProxyCert:    c.FrontProxyClient.Certificate,
		fileFrontProxyKey:     c.FrontProxyClient.Key,
		fileServiceAccountPub: c.ServiceAccountPublicKey,
		fileServiceAccountKey: c.ServiceAccountPrivateKey,
		fileControllerManager: kubeconfig(apiServerLocalEndpoint, "", c.CACertificate, c.ControllerManager.Certificate, c.ControllerManager.Key),
		fileScheduler:         kubeconfig(apiServerLocalEndpoint, "", c.CACertificate, c.Scheduler.Certificate, c.Scheduler.Key),
	}
}

// named is a child runnable with its name.
type named struct {
	name string
	fn   supervisor.Runnable
}

// runAll starts rs as children of the calling runnable.
func runAll(ctx context.Context, rs []named) error {
	for _, r := range rs {
		if err := supervisor.Run(ctx, r.name, r.fn); err != nil {
			return err
		}
	}
	return nil
}

// servedOnce wraps a readiness check: served is closed the first time
// it passes (the API server has served since this controller started).
func servedOnce(check func(context.Context) error) (served <-chan struct{}, ready func(context.Context) error) {
	ch := make(chan struct{})
	var once sync.Once
	return ch, func(ctx context.Context) error {
		err := check(ctx)
		if err == nil {
			once.Do(func() { close(ch) })
		}
		return err
	}
}

// command is a runnable running the kube binary (default
// layout.KubeBinary) with args.
func command(kube string, args []string, ready func(context.Context) error) supervisor.Runnable {
	if kube == "" {
		kube = layout.KubeBinary
	}
	return func(ctx context.Context) error {
		return supervisor.RunCommand(ctx, supervisor.Command{Path: kube, Args: args, Ready: ready})
	}
}

// apiReady checks an API server's /readyz (open to anonymous callers by
// the default RBAC) at endpoint, against the Kubernetes CA (PEM). The
// timeout is long on purpose: a starved API server (a VM under TCG)
// answers slowly, and a timed-out check costs it a new TLS handshake.
func apiReady(endpoint string, caPEM []byte) func(context.Context) error {
	pool := x509.NewCertPool()
	pool.AppendCertsFromPEM(caPEM)
	client := &http.Client{
		Timeout:   10 * time.Second,
		Transport: &http.Transport{TLSClientConfig: &tls.Config{RootCAs: pool, MinVersion: tls.VersionTLS12}},
	}
	return func(ctx context.Context) error {
		req, err := http.NewRequestWithContext(ctx, http.MethodGet, endpoint+"/readyz", nil)
		if err != nil {
			return err
		}
		resp, err := client.Do(req)
		if err != nil {
			return err
		}
		resp.Body.Close()
		if resp.StatusCode != http.StatusOK {
			return errors.New(resp.Status)
		}
		return nil
	}
}

// waitFor polls check every interval until it passes or ctx ends.
func waitFor(ctx context.Context, interval time.Duration, check func(context.Context) error) error {
	for check(ctx) != nil {
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(interval):
		}
	}
	return nil
}
