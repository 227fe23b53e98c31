package kubernetes

import (
	"cmp"
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"maps"
	"net"
	"net/http"
	"os"
	"sync"
	"syscall"
	"time"

	"plinth.dev/plinth/api/clusterpb"
	"plinth.dev/plinth/platform/event"
	"plinth.dev/plinth/platform/event/memory"
	"plinth.dev/plinth/platform/layout"
	"plinth.dev/plinth/platform/supervisor"
	"plinth.dev/plinth/roleserver/consensus"
	"plinth.dev/plinth/roleserver/consensus/client"
	"plinth.dev/plinth/roleserver/kubernetes/auditlog"
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
//	kube controller-manager
//	nodeipam                   ── Nodes' pod CIDRs (nodeipam.go)
//	kube scheduler
//	kube metrics-server        ── :10251, the metrics.k8s.io API (metrics.go)
//	metrics-api                ── its APIService, Service and this node's endpoint
//	rbac                       ── the roles Plinth's worker components need
//	volumes                    ── decommissioned nodes' local volumes deleted (decommission.go)
//	authz-webhook              ── 127.0.0.1:10252: decommissioned nodes' users denied, the API server's
//	                              authorization configuration kept naming them (authzwebhook.go)
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
	// Policy is the cluster policy as the curator keeps it (nil or
	// unset: Plinth's defaults): what workloads may do (a change
	// restarts the control plane with the new admission configuration)
	// and the epoch of the owner's credentials (a change rebinds
	// cluster-admin at once).
	Policy *memory.Value[*clusterpb.ClusterConfiguration]
	// AsRoot runs the components as root instead of their own users
	// (layout.APIServerUser, ...): for tests on a host that is not root.
	AsRoot bool
	// DecommissionedNodes lists the decommissioned nodes (the curator's
	// store), whose local volumes the controller deletes and whose
	// Kubernetes users its API server refuses (nil: neither).
	DecommissionedNodes func(context.Context) ([]string, error)
	// DecommissionPoll is how often it asks (0: decommissionPoll).
	DecommissionPoll time.Duration
	// KubeBinary is the multi-call Kubernetes binary; default
	// layout.KubeBinary (tests run the control plane on the host).
	KubeBinary string
}

// Run is a supervisor runnable: the API server first, the rest once it
// serves, then a restart when the certificates, the Secrets keys or the
// admission policy change.
func (c *Controller) Run(ctx context.Context) error {
	policy := c.Policy
	if policy == nil {
		policy = &memory.Value[*clusterpb.ClusterConfiguration]{}
		policy.Set(&clusterpb.ClusterConfiguration{})
	}
	pw := policy.Watch()
	defer pw.Close()
	cfg, err := pw.Get(ctx)
	if err != nil {
		return err
	}
	kv, err := c.Consensus.CuratorClient()
	if err != nil {
		return err
	}
	defer kv.Close()
	r, err := c.prepare(ctx, kv, admissionPolicy(cfg))
	if err != nil {
		return err
	}
	defer c.Status.Set(nil)
	if err := r.startAPIServer(ctx); err != nil {
		return err
	}
	if err := r.startOthers(ctx, policy); err != nil {
		return err
	}
	return r.untilChanged(ctx, pw)
}

// controllerRun is one run of the control plane: what Controller.Run
// prepared before any process started.
type controllerRun struct {
	c  *Controller
	kv client.Namespaced
	// issued is when creds were issued (they are renewed at two thirds
	// of their life).
	issued time.Time
	creds  *pki.ControllerCredentials
	// secrets are the Secrets encryption keys, read at secretsRev.
	secrets    *pki.SecretsKeys
	secretsRev int64
	admission  AdmissionPolicy
	// webhook is the authorization webhook's serving certificate, which
	// the API server's files trust (authzwebhook.go).
	webhook tls.Certificate
	// decommissioned are the nodes the API server's first authorization
	// configuration, authzConfig, refuses (read in prepare; the webhook
	// keeps it current).
	decommissioned []string
	authzConfig    []byte
	// apiserver, controllerManager, scheduler, metricsServer are each
	// one's files, by name, written into its own directory as its own
	// user.
	apiserver, controllerManager, scheduler, metricsServer map[string]string
}

// prepare issues the control plane's credentials from etcd and writes
// every component's files.
func (c *Controller) prepare(ctx context.Context, kv client.Namespaced, admission AdmissionPolicy) (*controllerRun, error) {
	r := &controllerRun{c: c, kv: kv, issued: time.Now(), admission: admission}
	var err error
	if r.creds, err = pki.New(kv).Controller(ctx, c.NodeID, []net.IP{c.Address}); err != nil {
		return nil, fmt.Errorf("control plane credentials: %w", err)
	}
	// Secrets are encrypted with keys the curator's namespace keeps; a
	// change of them restarts the control plane with the new ones.
	if r.secrets, r.secretsRev, err = pki.New(kv).SecretsKeys(ctx); err != nil {
		return nil, fmt.Errorf("secrets encryption keys: %w", err)
	}
	ctl := &c.Root.Ephemeral.Kubernetes.Controller
	var webhookCA []byte
	if r.webhook, webhookCA, err = webhookCertificate(); err != nil {
		return nil, err
	}
	// Unread, the API server starts asking the webhook about every node
	// user (authorizationConfig) until the webhook reads them.
	known := true
	if c.DecommissionedNodes != nil {
		if r.decommissioned, err = c.DecommissionedNodes(ctx); err != nil {
			known, r.decommissioned = false, nil
		}
	}
	r.authzConfig = authorizationConfig(ctl.APIServer.Path(), r.decommissioned, known)
	api := apiserverFiles(r.creds, admission, r.secrets, ctl.APIServer.Path())
	maps.Copy(api, authorizationFiles(ctl.APIServer.Path(), webhookCA, r.authzConfig))
	if r.apiserver, err = api.writeAs(ctl.APIServer.Path(), c.user(layout.APIServerUser)); err != nil {
		return nil, err
	}
	if r.controllerManager, err = controllerManagerFiles(r.creds).writeAs(ctl.ControllerManager.Path(), c.user(layout.ControllerManagerUser)); err != nil {
		return nil, err
	}
	if r.scheduler, err = schedulerFiles(r.creds).writeAs(ctl.Scheduler.Path(), c.user(layout.SchedulerUser)); err != nil {
		return nil, err
	}
	if r.metricsServer, err = metricsServerFiles(r.creds).writeAs(ctl.MetricsServer.Path(), c.user(layout.MetricsServerUser)); err != nil {
		return nil, err
	}
	return r, nil
}

// startAPIServer starts the API server and its confined etcd endpoint,
// and returns once the API server serves. The API server first: under
// TCG its start takes minutes of CPU, and the controller manager and
// scheduler only crash-loop (with a growing backoff) until it serves and
// its default roles exist.
func (r *controllerRun) startAPIServer(ctx context.Context) error {
	c := r.c
	etcdSock := c.Root.Ephemeral.Kubernetes.Controller.APIServer.EtcdSocket.Path()
	apiUser := os.Getuid()
	if u := c.user(layout.APIServerUser); u != nil {
		apiUser = int(u.Uid)
	}
	apiDir := c.Root.Ephemeral.Kubernetes.Controller.APIServer.Path()
	served, ready := servedOnce(apiReady(apiServerLocalEndpoint, r.creds.CACertificate))
	if err := runAll(ctx, []named{
		{"authz-webhook", authzWebhook(r.webhook, c.DecommissionedNodes, cmp.Or(c.DecommissionPoll, decommissionCheck), r.decommissioned, r.authzConfig,
			func(ids []string) []byte { return authorizationConfig(apiDir, ids, true) },
			func(config []byte) error {
				_, err := files{fileAuthorization: config}.writeAs(apiDir, c.user(layout.APIServerUser))
				return err
			})},
		{"etcd", func(ctx context.Context) error {
			supervisor.Signal(ctx, supervisor.SignalHealthy)
			return c.Consensus.ServeKubernetes(ctx, etcdSock, apiUser)
		}},
		{"apiserver", func(ctx context.Context) error {
			// Its audit log (--audit-log-path=-) is kept on the data
			// volume by class (auditlog) and followed live as a stream
			// of the node's log tree: plinthctl node logs NODE --audit.
			store, err := auditlog.Open(c.Root.Data.Kubernetes.Audit.Path(), nil)
			if err != nil {
				return fmt.Errorf("the audit log: %w", err)
			}
			defer store.Close()
			return supervisor.RunCommand(ctx, supervisor.Command{Path: c.kube(), Args: apiserverArgs(r.apiserver, c.Address, etcdSock),
				User: c.user(layout.APIServerUser), Ready: ready, Stdout: AuditStream, StdoutEntries: auditEntries, StdoutAlso: store})
		}},
	}); err != nil {
		return err
	}
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-served:
		return nil
	}
}

// startOthers starts what needs a serving API server (Plinth's RBAC,
// the node IPAM, the controller manager, the scheduler and the metrics
// API) and then
// says the control plane serves.
func (r *controllerRun) startOthers(ctx context.Context, policy *memory.Value[*clusterpb.ClusterConfiguration]) error {
	c := r.c
	others := []named{
		{"rbac", applyRBAC(pki.New(r.kv), c.NodeID, apiServerLocalEndpoint, policy)},
		{"nodeipam", nodeIPAM(r.kv, apiServerLocalEndpoint)},
		{"controller-manager", c.command(layout.ControllerManagerUser, controllerManagerArgs(r.controllerManager, c.Root.Ephemeral.Kubernetes.VolumePlugins.Path()), nil)},
		{"scheduler", c.command(layout.SchedulerUser, schedulerArgs(r.scheduler), nil)},
		{"metrics-server", c.command(layout.MetricsServerUser, metricsServerArgs(r.metricsServer), nil)},
		{"metrics-api", metricsAPI(pki.New(r.kv), c.NodeID, c.Address, apiServerLocalEndpoint, r.creds.CACertificate)},
	}
	if c.DecommissionedNodes != nil {
		others = append(others, named{"volumes", decommissionedVolumes(pki.New(r.kv), c.NodeID, apiServerLocalEndpoint, c.DecommissionedNodes, cmp.Or(c.DecommissionPoll, decommissionPoll))})
	}
	if err := runAll(ctx, others); err != nil {
		return err
	}
	// Every controller says which keys it runs with, so that a rotation
	// moves on only once all can read what the next step writes.
	if err := pki.New(r.kv).SetSecretsLoaded(ctx, c.NodeID, r.secrets.Generation); err != nil {
		return err
	}
	supervisor.Logger(ctx).Info("Kubernetes API server serving", "address", apiServerLocalEndpoint, "secrets-key-generation", r.secrets.Generation)
	c.Status.Set(&Status{APIServer: apiServerLocalEndpoint, CACertificate: r.creds.CACertificate})
	supervisor.Signal(ctx, supervisor.SignalHealthy)
	return nil
}

// untilChanged waits for a reason to restart: new credentials at two
// thirds of their life (a restart issues them from etcd, which this node
// serves: nothing to wait for), new Secrets keys, or a new admission
// policy (Pod Security's configuration is read once).
func (r *controllerRun) untilChanged(ctx context.Context, pw event.Watcher[*clusterpb.ClusterConfiguration]) error {
	renew := time.After(time.Until(pki.RenewAt(r.issued, r.creds.NotAfter)))
	changed := make(chan error, 1)
	go func() {
		for {
			cfg, err := pw.Get(ctx)
			if err != nil {
				changed <- err
				return
			}
			if !admissionPolicy(cfg).equal(r.admission) {
				changed <- fmt.Errorf("the cluster policy's admission changed: %w", supervisor.ErrRestart)
				return
			}
		}
	}()
	keysChanged := pki.New(r.kv).WatchSecretsKeys(ctx, r.kv, r.secretsRev)
	log := supervisor.Logger(ctx)
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-keysChanged:
		if ctx.Err() != nil {
			return ctx.Err()
		}
		log.Info("restarting the control plane with the new Secrets encryption keys")
		return fmt.Errorf("the Secrets encryption keys changed: %w", supervisor.ErrRestart)
	case <-renew:
		return fmt.Errorf("renewing the control plane's certificates (valid until %v): %w", r.creds.NotAfter, supervisor.ErrRestart)
	case err := <-changed:
		log.Info("restarting the control plane", "reason", err)
		return err
	}
}

// apiserverFiles are the API server's files: its serving certificate,
// the CAs it checks clients and kubelets against, its clients'
// certificates for the kubelets and aggregated servers, the service
// account keys and its policies (APIServerPolicyKinds: admission with
// a, audit, encryption of Secrets with k; dir is where they go).
func apiserverFiles(c *pki.ControllerCredentials, a AdmissionPolicy, k *pki.SecretsKeys, dir string) files {
	f := files{
		fileCA:                c.CACertificate,
		fileFrontProxyCA:      c.FrontProxyCACertificate,
		fileKubeletServingCA:  c.KubeletServingCACertificate,
		fileAPIServerCert:     c.APIServer.Certificate,
		fileAPIServerKey:      c.APIServer.Key,
		fileKubeletClientCert: c.KubeletClient.Certificate,
		fileKubeletClientKey:  c.KubeletClient.Key,
		fileFrontProxyCert:    c.FrontProxyClient.Certificate,
		fileFrontProxyKey:     c.FrontProxyClient.Key,
		fileServiceAccountPub: c.ServiceAccountPublicKey,
		fileServiceAccountKey: c.ServiceAccountPrivateKey,
	}
	maps.Copy(f, policyFiles(dir, a, k))
	return f
}

// controllerManagerFiles are the controller manager's: its kubeconfig,
// the CA it hands pods and the key it signs service account tokens with.
func controllerManagerFiles(c *pki.ControllerCredentials) files {
	return files{
		fileCA:                c.CACertificate,
		fileServiceAccountKey: c.ServiceAccountPrivateKey,
		fileControllerManager: kubeconfig(apiServerLocalEndpoint, "", c.CACertificate, c.ControllerManager.Certificate, c.ControllerManager.Key),
	}
}

// schedulerFiles are the scheduler's: its kubeconfig.
func schedulerFiles(c *pki.ControllerCredentials) files {
	return files{fileScheduler: kubeconfig(apiServerLocalEndpoint, "", c.CACertificate, c.Scheduler.Certificate, c.Scheduler.Key)}
}

// user is the credential a component of uid runs as (its group of the
// same number, no supplementary groups); nil when Controller.AsRoot.
func (c *Controller) user(uid uint32) *syscall.Credential {
	if c.AsRoot {
		return nil
	}
	return &syscall.Credential{Uid: uid, Gid: uid, Groups: []uint32{}}
}

// command is a runnable running the kube binary as the component of uid.
func (c *Controller) command(uid uint32, args []string, ready func(context.Context) error) supervisor.Runnable {
	return kubeCommand(supervisor.Command{Path: c.KubeBinary, User: c.user(uid), Args: args, Ready: ready})
}

// kube is the kube binary's path.
func (c *Controller) kube() string {
	if c.KubeBinary == "" {
		return layout.KubeBinary
	}
	return c.KubeBinary
}

// AuditStream is the log stream below the API server's runnable that its
// audit events go to as they come, one JSON object per entry, AuditDN
// its whole DN; auditEntries bounds it (about a few MiB: the shared log
// ring is not pushed out by it). What lasts is the store on the data
// volume (auditlog), which NodeManagement.Logs reads for AuditDN's
// backlog.
const (
	AuditStream  = "audit"
	AuditDN      = "root.roleserver.kubernetes.controller.apiserver." + AuditStream
	auditEntries = 4000
)

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

// kubeCommand is a runnable running the kube binary (cmd.Path, default
// layout.KubeBinary) as cmd says.
func kubeCommand(cmd supervisor.Command) supervisor.Runnable {
	if cmd.Path == "" {
		cmd.Path = layout.KubeBinary
	}
	return func(ctx context.Context) error { return supervisor.RunCommand(ctx, cmd) }
}

// apiReady checks an API server's /readyz (open to anonymous callers by
// the default RBAC) at endpoint, against the Kubernetes CA (PEM).
// The timeout is long on purpose: a starved API server (a VM under TCG)
// answers slowly, and a timed-out check costs it a new TLS handshake.
func apiReady(endpoint string, caPEM []byte) func(context.Context) error {
	pool := x509.NewCertPool()
	pool.AppendCertsFromPEM(caPEM)
	client := &http.Client{
		Timeout:   10 * time.Second,
		Transport: &http.Transport{TLSClientConfig: &tls.Config{RootCAs: pool, MinVersion: tls.VersionTLS12}},
	}
	return func(ctx context.Context) error { return getOK(ctx, client, endpoint+"/readyz") }
}

// getOK GETs url with client and wants 200 (a health check: the body
// is not read).
func getOK(ctx context.Context, client *http.Client, url string) error {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
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
