package roleserver

import (
	"context"
	"crypto/x509"
	"fmt"
	"net"
	"strconv"
	"time"

	"plinth.dev/plinth/api/clusterpb"
	"plinth.dev/plinth/platform/event/memory"
	"plinth.dev/plinth/platform/layout"
	"plinth.dev/plinth/platform/supervisor"
	"plinth.dev/plinth/roleserver/consensus"
	"plinth.dev/plinth/roleserver/curator"
	"plinth.dev/plinth/roleserver/kubernetes"
	"plinth.dev/plinth/roleserver/localstorage"
)

// workerKubernetes runs Kubernetes as the node's roles say: the control
// plane (kubernetes.Controller) with the KubernetesController role, on
// top of the node's running consensus member; the worker
// (kubernetes.Worker) with the KubernetesWorker role. A change of either
// role restarts this runnable, which stops what the node no longer runs
// (a removed worker reports its Node NotReady at once and its pods'
// containers are stopped) and starts what it now does.
type workerKubernetes struct {
	root *localstorage.Root
	// inputs
	node         *memory.Value[*nodeData]
	roles        *memory.Value[*clusterpb.NodeRoles]
	controlPlane *memory.Value[*ControlPlane]
	curator      *memory.Value[*CuratorConnection]
	// controllers are the API servers the cluster lists (host:port).
	controllers *memory.Value[[]string]
	// policy is the cluster policy from the curator (policyfetch): the
	// worker's image registries.
	policy      *memory.Value[*clusterpb.ClusterConfiguration]
	address     func(ctx context.Context) (net.IP, error)
	resolvConf  string
	loadModules func() error
	// stopPods ends what pods left running (nil: nothing to do).
	stopPods func() (int, error)
	// output: set while the local API server serves.
	status *memory.Value[*kubernetes.Status]

	// runController and runWorker make the runnables of the two roles
	// (nil: kubernetes.Controller and kubernetes.Worker; tests put fakes
	// in). runWorker also returns what reports the worker stopped
	// (kubernetes.Worker.ReportStopped).
	runController func(nodeID string, addr net.IP, st *consensus.Status) supervisor.Runnable
	runWorker     func(nodeID string, addr net.IP, conn *CuratorConnection) (supervisor.Runnable, reportStopped)

	// stopped reports the last worker this runnable ran stopped (nil: no
	// worker ran since the last report).
	stopped reportStopped
}

// reportStopped tells the API servers (host:port) that the node's
// kubelet is gone.
type reportStopped func(ctx context.Context, servers []string) error

// reportStoppedTimeout bounds the report of a removed worker: the
// controllers may be unreachable, and the node lifecycle controller
// notices a silent kubelet by itself, later.
const reportStoppedTimeout = 15 * time.Second

func (w *workerKubernetes) controllerRunnable(nodeID string, addr net.IP, st *consensus.Status) supervisor.Runnable {
	if w.runController != nil {
		return w.runController(nodeID, addr, st)
	}
	// The control plane follows the cluster policy in the node's own
	// etcd member (a controller is a consensus member).
	policy := &memory.Value[*clusterpb.ClusterConfiguration]{}
	return func(ctx context.Context) error {
		// The member may have restarted since the last run: its clients
		// are in-process and end with it.
		if !st.Running() {
			var err error
			if st, err = w.consensus(ctx); err != nil {
				return err
			}
		}
		kv, err := st.CuratorClient()
		if err != nil {
			return err
		}
		defer kv.Close()
		c := &kubernetes.Controller{Root: w.root, NodeID: nodeID, Address: addr, Consensus: st, Status: w.status, Policy: policy,
			DecommissionedNodes: func(ctx context.Context) ([]string, error) { return curator.DecommissionedNodes(ctx, kv) }}
		if err := supervisor.Run(ctx, "policy", func(ctx context.Context) error {
			supervisor.Signal(ctx, supervisor.SignalHealthy)
			return curator.WatchConfiguration(ctx, kv, policy.Set)
		}); err != nil {
			return err
		}
		return c.Run(ctx)
	}
}

func (w *workerKubernetes) workerRunnable(nodeID string, addr net.IP, conn *CuratorConnection, controller bool) (supervisor.Runnable, reportStopped) {
	if w.runWorker != nil {
		return w.runWorker(nodeID, addr, conn)
	}
	wk := &kubernetes.Worker{
		Root: w.root, NodeID: nodeID, Address: addr, ResolvConf: w.resolvConf, ControlPlane: controller,
		APIServers: w.controllers, LoadModules: w.loadModules,
		Certify: func(ctx context.Context, keys kubernetes.WorkerKeys) (*kubernetes.WorkerCertificates, error) {
			return certifyWorker(ctx, conn, keys)
		},
	}
	if w.policy != nil {
		wk.Policy = w.policy
	}
	return wk.Run, wk.ReportStopped
}

func (w *workerKubernetes) run(ctx context.Context) error {
	log := supervisor.Logger(ctx)
	nd, err := wait(ctx, w.node)
	if err != nil {
		return err
	}
	rw := w.roles.Watch()
	defer rw.Close()
	roles, err := rw.Get(ctx, nonNilRoles)
	if err != nil {
		return err
	}
	controller, worker := roles.GetKubernetesController() != nil, roles.GetKubernetesWorker() != nil
	if !controller && !worker {
		log.Info("no Kubernetes role")
	}
	if !worker && w.stopPods != nil {
		// Also after the role's removal: the worker stopped with the
		// runnable's last run, its pods' containers did not.
		if n, err := w.stopPods(); err != nil {
			log.Error("stopping pods left without a kubelet", "err", err)
		} else if n > 0 {
			log.Info("stopped the pods left without a kubelet", "shims", n)
		}
	}
	if !worker && w.stopped != nil {
		// The worker's last run has ended (its kubelet with it).
		rctx, cancel := context.WithTimeout(ctx, reportStoppedTimeout)
		if err := w.stopped(rctx, get(w.controllers)); err != nil {
			log.Warn("reporting the stopped kubelet's Node NotReady (the node lifecycle controller will notice later)", "err", err)
		} else {
			log.Info("reported the stopped kubelet's Node NotReady")
		}
		cancel()
		w.stopped = nil
	}
	if controller || worker {
		addr, err := w.address(ctx)
		if err != nil {
			return err
		}
		if controller {
			st, err := w.consensus(ctx)
			if err != nil {
				return err
			}
			if err := supervisor.Run(ctx, "controller", w.controllerRunnable(nd.nodeID, addr, st)); err != nil {
				return err
			}
		}
		if worker {
			conn, err := wait(ctx, w.curator)
			if err != nil {
				return err
			}
			run, stopped := w.workerRunnable(nd.nodeID, addr, conn, controller)
			w.stopped = stopped
			if err := supervisor.Run(ctx, "worker", run); err != nil {
				return err
			}
		}
	}
	supervisor.Signal(ctx, supervisor.SignalHealthy)
	for {
		next, err := rw.Get(ctx, nonNilRoles)
		if err != nil {
			return err
		}
		if (next.GetKubernetesController() != nil) != controller || (next.GetKubernetesWorker() != nil) != worker {
			log.Info("Kubernetes roles changed", "controller", next.GetKubernetesController() != nil, "worker", next.GetKubernetesWorker() != nil)
			return fmt.Errorf("kubernetes roles changed: %w", supervisor.ErrRestart)
		}
	}
}

// consensus waits for the node's running etcd member (the controller
// role needs the consensus member role).
func (w *workerKubernetes) consensus(ctx context.Context) (*consensus.Status, error) {
	cw := w.controlPlane.Watch()
	defer cw.Close()
	for {
		cp, err := cw.Get(ctx)
		if err != nil {
			return nil, err
		}
		if cp == nil || !cp.Running || cp.Consensus == nil {
			supervisor.Logger(ctx).Info("KubernetesController: waiting for this node's consensus member")
			continue
		}
		sw := cp.Consensus.Watch()
		st, err := sw.Get(ctx, consensus.FilterRunning)
		sw.Close()
		return st, err
	}
}

// certifyWorker asks the curator for the worker's certificates.
func certifyWorker(ctx context.Context, conn *CuratorConnection, keys kubernetes.WorkerKeys) (*kubernetes.WorkerCertificates, error) {
	resp, err := conn.Curator().IssueCertificate(ctx, &clusterpb.IssueCertificateRequest{
		Kind: &clusterpb.IssueCertificateRequest_KubernetesWorker_{KubernetesWorker: &clusterpb.IssueCertificateRequest_KubernetesWorker{
			KubeletClientPublicKey: keys.KubeletClient,
			KubeletServerPublicKey: keys.KubeletServer,
			ProxyPublicKey:         keys.Proxy,
			LocalVolumesPublicKey:  keys.LocalVolumes,
		}},
	})
	if err != nil {
		return nil, err
	}
	kw := resp.GetKubernetesWorker()
	out := &kubernetes.WorkerCertificates{}
	for _, c := range []struct {
		dst **x509.Certificate
		der []byte
		of  string
	}{
		{&out.CA, kw.GetIdentityCaCertificate(), "CA"},
		{&out.KubeletClient, kw.GetKubeletClientCertificate(), "kubelet client"},
		{&out.KubeletServer, kw.GetKubeletServerCertificate(), "kubelet server"},
		{&out.Proxy, kw.GetProxyCertificate(), "kube-proxy"},
		{&out.ServingCA, kw.GetKubeletServingCaCertificate(), "kubelet serving CA"},
	} {
		cert, err := x509.ParseCertificate(c.der)
		if err != nil {
			return nil, fmt.Errorf("%s certificate from the curator: %w", c.of, err)
		}
		*c.dst = cert
	}
	for _, c := range []*x509.Certificate{out.KubeletClient, out.Proxy} {
		if err := c.CheckSignatureFrom(out.CA); err != nil {
			return nil, fmt.Errorf("certificate %q from the curator is not from its Kubernetes CA: %w", c.Subject.CommonName, err)
		}
	}
	if der := kw.GetLocalVolumesCertificate(); len(der) > 0 {
		if out.LocalVolumes, err = x509.ParseCertificate(der); err == nil {
			err = out.LocalVolumes.CheckSignatureFrom(out.CA)
		}
		if err != nil {
			return nil, fmt.Errorf("the local volume provisioner's certificate from the curator: %w", err)
		}
	}
	if err := out.KubeletServer.CheckSignatureFrom(out.ServingCA); err != nil {
		return nil, fmt.Errorf("the kubelet's serving certificate from the curator is not from its kubelet serving CA: %w", err)
	}
	if c := kw.GetPodCidr(); c != "" {
		if _, out.PodCIDR, err = net.ParseCIDR(c); err != nil {
			return nil, fmt.Errorf("pod CIDR from the curator: %w", err)
		}
	}
	return out, nil
}

// apiServerAddresses are the API servers of the UP controller nodes.
func apiServerAddresses(nodes map[string]*clusterpb.Node) []string {
	var out []string
	for _, n := range nodes {
		if n.GetState() != clusterpb.NodeState_NODE_STATE_UP || n.GetRoles().GetKubernetesController() == nil {
			continue
		}
		if a := n.GetStatus().GetAddresses(); len(a) > 0 {
			out = append(out, net.JoinHostPort(a[0], strconv.Itoa(layout.KubernetesAPIPort)))
		}
	}
	return out
}
