package kubernetes

import (
	"context"
	"crypto/ed25519"
	"crypto/rand"
	"crypto/x509"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"sync/atomic"
	"time"

	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"

	"plinth.dev/plinth/api/clusterpb"
	"plinth.dev/plinth/platform/event"
	"plinth.dev/plinth/platform/layout"
	"plinth.dev/plinth/platform/pki"
	"plinth.dev/plinth/platform/supervisor"
	"plinth.dev/plinth/platform/volumefs"
	kpki "plinth.dev/plinth/roleserver/kubernetes/pki"
	"plinth.dev/plinth/roleserver/localstorage"
)

// WorkerKeys are the public keys of a worker's Kubernetes clients and
// server, for which the curator issues certificates.
type WorkerKeys struct {
	KubeletClient, KubeletServer, Proxy ed25519.PublicKey
	// LocalVolumes is the local volume provisioner's.
	LocalVolumes ed25519.PublicKey
}

// WorkerCertificates are what the curator issued for WorkerKeys.
type WorkerCertificates struct {
	CA                                  *x509.Certificate
	KubeletClient, KubeletServer, Proxy *x509.Certificate
	// ServingCA signed KubeletServer (the API servers check kubelets
	// against it alone).
	ServingCA *x509.Certificate
	// PodCIDR is the node's pod CIDR (nil from a curator that does not
	// allocate them: netd then waits for the Node's spec.podCIDR).
	PodCIDR *net.IPNet
	// LocalVolumes is the local volume provisioner's certificate, from
	// CA (nil from a curator that issues none: the node then runs no
	// provisioner).
	LocalVolumes *x509.Certificate
}

// nodeIP is the address the kubelet registers its Node with (and the API
// servers reach it at): the node's own, if its serving certificate
// names it, else the first address the certificate names (the curator
// certified the addresses it saw the node at, never what the node
// claims).
func nodeIP(own net.IP, serving *x509.Certificate) net.IP {
	for _, ip := range serving.IPAddresses {
		if ip.Equal(own) {
			return own
		}
	}
	if len(serving.IPAddresses) > 0 {
		return serving.IPAddresses[0]
	}
	return own
}

// netdArgs runs netd for this node; with the pod CIDR the curator
// allocated, netd configures the pod network as it starts, before it
// reads the Node.
func netdArgs(kubeconfig, node, cniConfDir, ipamDir string, podCIDR *net.IPNet) []string {
	args := []string{"netd", "-kubeconfig", kubeconfig, "-node", node, "-cni-conf-dir", cniConfDir, "-ipam-dir", ipamDir}
	if podCIDR != nil {
		args = append(args, "-pod-cidr", podCIDR.String())
	}
	return args
}

// Worker runs what a node with the KubernetesWorker role needs to run
// pods:
//
//	apiproxy    127.0.0.1:6444 ──► the controllers' API servers (from the curator)
//	containerd  images and snapshots on /data, state on tmpfs
//	images      the builder's pause and test images imported at start
//	kubelet     certificates from the curator (serving SANs: ID + known addresses)
//	proxy       kube-proxy, nftables mode
//	netd        CNI configuration for this node's pod CIDR, routes to the others'
//	dns         CoreDNS on ClusterDNSIP (a dummy interface)
//	registries  the policy's mirrors, CAs and credentials for pulls (registries.go)
//	netpol      NetworkPolicy for this node's pods (kube network-policies: nftables)
//	volumes     the local volume provisioner (kube local-volumes): the
//	            node's PersistentVolumes, each a filesystem of its own
//	            (platform/volumefs) below layout.LocalVolumesDir
//
// Nothing here ever deletes /data/containerd or the kubelet's state: a
// worker that cannot reach a controller retries (its runnables back off)
// and says why in its log.
type Worker struct {
	Root    *localstorage.Root
	NodeID  string
	Address net.IP
	// ResolvConf is the node's resolver configuration.
	ResolvConf string
	// ControlPlane: the node also runs the control plane (a controller),
	// whose CPU the kubelet keeps from pods (controlPlaneCPU).
	ControlPlane bool
	// APIServers are the controllers' API servers (host:port).
	APIServers event.Value[[]string]
	// Certify asks the curator for the worker's certificates.
	Certify func(ctx context.Context, keys WorkerKeys) (*WorkerCertificates, error)
	// LoadModules loads the kernel modules Kubernetes needs (nf_tables,
	// overlay, veth, dummy…).
	LoadModules func() error
	// Policy is the cluster policy (from the curator): the image
	// registries containerd and the kubelet pull from (registries.go).
	// nil: no registry configuration.
	Policy event.Value[*clusterpb.ClusterConfiguration]

	// renewed are certificates obtained for the next run (renewal).
	renewed *workerCredentials
	// running are the credentials of the last run (ReportStopped uses
	// the kubelet's).
	running atomic.Pointer[workerCredentials]
}

// Run is a supervisor runnable: the node made ready for pods, the
// credentials from the curator, the processes, and a restart when the
// certificates are renewed.
func (w *Worker) Run(ctx context.Context) error {
	if err := w.prepareNode(supervisor.Logger(ctx)); err != nil {
		return err
	}
	cred := w.renewed
	w.renewed = nil
	if cred == nil || time.Now().After(cred.certs.KubeletClient.NotAfter) {
		supervisor.Logger(ctx).Info("asking the curator for the kubelet's and kube-proxy's certificates")
		var err error
		if cred, err = w.certify(ctx); err != nil {
			return err
		}
	}
	w.running.Store(cred)
	f, err := workerFiles(w, cred.keys, cred.certs)
	if err != nil {
		return err
	}
	paths, err := f.write(w.Root.Ephemeral.Kubernetes.Worker.Path())
	if err != nil {
		return err
	}
	if err := os.WriteFile(w.Root.Ephemeral.Containerd.Config.Path(), containerdConfig(w.Root), 0o600); err != nil {
		return err
	}
	if err := runAll(ctx, w.processes(paths, cred.certs)); err != nil {
		return err
	}
	supervisor.Signal(ctx, supervisor.SignalHealthy)
	return w.renewWhenDue(ctx, cred)
}

// prepareNode makes the node ready to run pods: kernel modules, IPv4
// forwarding, the DNS address, the machine ID, the worker's directories
// and the bind mounts of the kubelet's and CNI's fixed paths.
func (w *Worker) prepareNode(log *slog.Logger) error {
	if w.LoadModules != nil {
		if err := w.LoadModules(); err != nil {
			return fmt.Errorf("loading kernel modules: %w", err)
		}
	}
	if err := os.WriteFile("/proc/sys/net/ipv4/ip_forward", []byte("1\n"), 0); err != nil {
		return fmt.Errorf("enabling IPv4 forwarding: %w", err)
	}
	if err := dnsAddress(); err != nil {
		return err
	}
	if err := machineID(w.NodeID); err != nil {
		return err
	}
	for _, d := range []*localstorage.Directory{&w.Root.Data.Containerd, &w.Root.Data.Kubernetes.Kubelet,
		&w.Root.Data.Kubernetes.PodLogs, &w.Root.Ephemeral.Containerd.Directory, &w.Root.Ephemeral.Kubernetes.Worker,
		&w.Root.Ephemeral.Kubernetes.CNI, &w.Root.Ephemeral.Kubernetes.VolumePlugins, &w.Root.Data.Kubernetes.LocalVolumes,
		&w.Root.Data.Kubernetes.LocalVolumeImages} {
		if err := os.MkdirAll(d.Path(), 0o700); err != nil {
			return err
		}
	}
	// The local volumes' filesystems, before the kubelet hands any to a
	// pod (each directory beneath is immutable: an unmounted one takes
	// nothing).
	// One that does not mount is said and left: its pods fail, the
	// others run.
	if n, err := volumefs.AttachAll(w.Root.Data.Kubernetes.LocalVolumes.Path(), w.Root.Data.Kubernetes.LocalVolumeImages.Path()); err != nil {
		log.Error("local volumes not mounted: their pods cannot run", "mounted", n, "err", err)
	} else if n > 0 {
		log.Info("local volumes mounted", "volumes", n)
	}
	if err := bindMount(w.Root.Data.Kubernetes.Kubelet.Path(), kubeletDir, true); err != nil {
		return err
	}
	return bindMount(w.Root.Ephemeral.Kubernetes.CNICache.Path(), cniCacheDir, false)
}

// processes are the worker's runnables, with their files (paths, by
// name) and certificates.
//
// Everything that talks to the API waits for an API server to pass
// /readyz (the kubelet for containerd too): on a controller node they
// would only take CPU from its start. Tried: the kubelet started with
// containerd, so that its own start (~6 s under TCG) overlaps the API
// server's. Until its Node is registered it logs errors several times a
// second, each a line on the serial console, which under TCG costs the
// guest CPU per byte: with two kubelets at it the API server's start took
// four minutes instead of one. netd writes the pod network for the
// curator's CIDR as it starts, before the kubelet has registered, so the
// Node is Ready when it registers.
func (w *Worker) processes(paths map[string]string, certs *WorkerCertificates) []named {
	sock := w.Root.Ephemeral.Containerd.Socket.Path()
	containerdUp := func(ctx context.Context) error {
		c, err := net.DialTimeout("unix", sock, time.Second)
		if err == nil {
			c.Close()
		}
		return err
	}
	apiUp := apiReady(fmt.Sprintf("https://127.0.0.1:%d", layout.KubernetesAPIProxyPort), pki.CertificatePEM(certs.CA))
	afterAPI := func(r supervisor.Runnable) supervisor.Runnable { return after(2*time.Second, apiUp, r) }
	afterContainerd := func(r supervisor.Runnable) supervisor.Runnable { return after(500*time.Millisecond, containerdUp, r) }
	proxy := &apiProxy{servers: w.APIServers}
	var optional []named
	if w.Policy != nil {
		optional = append(optional, named{"registries", followRegistries(&w.Root.Ephemeral, w.Policy)})
	}
	if certs.LocalVolumes != nil {
		optional = append(optional, named{"volumes", afterAPI(kubeCommand(supervisor.Command{Args: []string{"local-volumes", "-kubeconfig", paths[fileVolumesKubeconfig],
			"-node", w.NodeID, "-dir", w.Root.Data.Kubernetes.LocalVolumes.Path(), "-images", w.Root.Data.Kubernetes.LocalVolumeImages.Path()}}))})
	}
	return append(optional, []named{
		{"apiproxy", proxy.run},
		{"containerd", func(ctx context.Context) error {
			return supervisor.RunCommand(ctx, supervisor.Command{
				Path: layout.ContainerdBinary, Args: []string{"--config", w.Root.Ephemeral.Containerd.Config.Path()},
				Ready: containerdUp, Cgroup: runtimeCgroup,
			})
		}},
		{"images", afterContainerd(func(ctx context.Context) error {
			if err := supervisor.RunCommand(ctx, supervisor.Command{
				Path: layout.KubeBinary, Args: []string{"import-images", "-address", sock, layout.ImagesDir},
			}); err != nil {
				return err
			}
			supervisor.Signal(ctx, supervisor.SignalDone)
			return nil
		})},
		{"kubelet", afterAPI(afterContainerd(kubeletWithRegistries(&w.Root.Ephemeral, w.Policy, kubeletArgs(paths[fileKubeletConfig],
			paths[fileKubeletKubeconfig], kubeletDir, w.NodeID, nodeIP(w.Address, certs.KubeletServer)))))},
		{"proxy", afterAPI(kubeCommand(supervisor.Command{Args: []string{"proxy", "--config=" + paths[fileProxyConfig], "--v=0"}}))},
		{"netd", afterAPI(kubeCommand(supervisor.Command{Args: netdArgs(paths[fileProxyKubeconfig], w.NodeID, w.Root.Ephemeral.Kubernetes.CNI.Path(),
			filepath.Join(w.Root.Ephemeral.Kubernetes.Path(), "ipam"), certs.PodCIDR)}))},
		{"dns", afterAPI(kubeCommand(supervisor.Command{Args: []string{"dns", "-conf", paths[fileCorefile]}}))},
		{"netpol", afterAPI(kubeCommand(supervisor.Command{Args: []string{"network-policies", "-kubeconfig", paths[fileProxyKubeconfig], "-node", w.NodeID}}))},
	}...)
}

// after runs r once ready passes (polled every interval).
func after(interval time.Duration, ready func(context.Context) error, r supervisor.Runnable) supervisor.Runnable {
	return func(ctx context.Context) error {
		if err := waitFor(ctx, interval, ready); err != nil {
			return err
		}
		return r(ctx)
	}
}

// renewWhenDue asks for new certificates at two thirds of cred's life,
// while these still serve (retried until the curator answers), and then
// ends the run for a restart with them.
func (w *Worker) renewWhenDue(ctx context.Context, cred *workerCredentials) error {
	notAfter := cred.certs.KubeletClient.NotAfter
	next, err := renewWhenDue(ctx, kpki.RenewAt(cred.issued, notAfter), time.Minute, w.certify,
		func(err error) {
			supervisor.Logger(ctx).Warn("renewing the worker's certificates", "err", err, "valid until", notAfter)
		})
	if err != nil {
		return err
	}
	w.renewed = next
	return fmt.Errorf("renewing the worker's certificates (valid until %v): %w", notAfter, supervisor.ErrRestart)
}

// renewWhenDue waits until due, then calls certify until it succeeds
// (every retry; failed says why) or ctx ends.
func renewWhenDue[T any](ctx context.Context, due time.Time, retry time.Duration, certify func(context.Context) (T, error), failed func(error)) (T, error) {
	var zero T
	select {
	case <-ctx.Done():
		return zero, ctx.Err()
	case <-time.After(time.Until(due)):
	}
	for {
		next, err := certify(ctx)
		if err == nil {
			return next, nil
		}
		failed(err)
		select {
		case <-ctx.Done():
			return zero, ctx.Err()
		case <-time.After(retry):
		}
	}
}

// workerCredentials are the worker's keys and their certificates.
type workerCredentials struct {
	keys   *workerKeys
	certs  *WorkerCertificates
	issued time.Time
}

// certify makes new keys and asks the curator to certify them.
func (w *Worker) certify(ctx context.Context) (*workerCredentials, error) {
	keys, pub, err := newWorkerKeys()
	if err != nil {
		return nil, err
	}
	issued := time.Now()
	certs, err := w.Certify(ctx, pub)
	if err != nil {
		return nil, fmt.Errorf("worker certificates: %w", err)
	}
	return &workerCredentials{keys: keys, certs: certs, issued: issued}, nil
}

// Files of the worker's components, in the worker directory.
const (
	fileWorkerCA          = "ca.pem"
	fileKubeletCert       = "kubelet.pem"
	fileKubeletKey        = "kubelet-key.pem"
	fileKubeletConfig     = "kubelet.json"
	fileKubeletKubeconfig = "kubelet.kubeconfig"
	fileProxyKubeconfig   = "proxy.kubeconfig"
	fileVolumesKubeconfig = "local-volumes.kubeconfig"
	fileProxyConfig       = "proxy.json"
	fileCorefile          = "Corefile"
)

// workerKeys are the private halves of WorkerKeys.
type workerKeys struct {
	kubeletClient, kubeletServer, proxy, localVolumes ed25519.PrivateKey
}

func newWorkerKeys() (*workerKeys, WorkerKeys, error) {
	var k workerKeys
	var pub WorkerKeys
	for _, p := range []struct {
		priv *ed25519.PrivateKey
		pub  *ed25519.PublicKey
	}{{&k.kubeletClient, &pub.KubeletClient}, {&k.kubeletServer, &pub.KubeletServer}, {&k.proxy, &pub.Proxy}, {&k.localVolumes, &pub.LocalVolumes}} {
		pk, sk, err := ed25519.GenerateKey(rand.Reader)
		if err != nil {
			return nil, pub, err
		}
		*p.priv, *p.pub = sk, pk
	}
	return &k, pub, nil
}

// workerFiles are the worker's configuration and credentials. The
// components reach the API servers through the local proxy; its address
// is in the API server's certificate (127.0.0.1).
func workerFiles(w *Worker, k *workerKeys, c *WorkerCertificates) (files, error) {
	keyPEM := func(key ed25519.PrivateKey) ([]byte, error) { return pki.PrivateKeyPEM(key) }
	kubeletClientKey, err := keyPEM(k.kubeletClient)
	if err != nil {
		return nil, err
	}
	kubeletServerKey, err := keyPEM(k.kubeletServer)
	if err != nil {
		return nil, err
	}
	proxyKey, err := keyPEM(k.proxy)
	if err != nil {
		return nil, err
	}
	ca := pki.CertificatePEM(c.CA)
	server := fmt.Sprintf("https://127.0.0.1:%d", layout.KubernetesAPIProxyPort)
	dir := w.Root.Ephemeral.Kubernetes.Worker.Path()
	f := files{
		fileWorkerCA:          ca,
		fileKubeletCert:       pki.CertificatePEM(c.KubeletServer),
		fileKubeletKey:        kubeletServerKey,
		fileKubeletKubeconfig: kubeconfig(server, "", ca, pki.CertificatePEM(c.KubeletClient), kubeletClientKey),
		fileProxyKubeconfig:   kubeconfig(server, "", ca, pki.CertificatePEM(c.Proxy), proxyKey),
		fileKubeletConfig: kubeletConfig(kubeletParams{root: w.Root, clientCA: filepath.Join(dir, fileWorkerCA),
			certFile: filepath.Join(dir, fileKubeletCert), keyFile: filepath.Join(dir, fileKubeletKey), resolvConf: w.ResolvConf,
			cpus: runtime.NumCPU(), controlPlane: w.ControlPlane}),
		fileProxyConfig: proxyConfig(filepath.Join(dir, fileProxyKubeconfig), w.NodeID),
		fileCorefile:    corefile(filepath.Join(dir, fileProxyKubeconfig), w.ResolvConf),
	}
	if c.LocalVolumes != nil {
		volumesKey, err := keyPEM(k.localVolumes)
		if err != nil {
			return nil, err
		}
		f[fileVolumesKubeconfig] = kubeconfig(server, "", ca, pki.CertificatePEM(c.LocalVolumes), volumesKey)
	}
	return f, nil
}

// The worker's mounts on fixed paths of the system image.
const (
	kubeletDir  = layout.KubeletDir
	cniCacheDir = layout.CNICacheDir
)

// bindMount mounts src at dst (a mount point in the system image), once;
// shared makes mounts below it propagate (the kubelet's volumes must reach
// the containers).
func bindMount(src, dst string, shared bool) error {
	if err := os.MkdirAll(src, 0o700); err != nil {
		return err
	}
	if mounted, err := isMountPoint(dst); err != nil || mounted {
		return err
	}
	if err := unix.Mount(src, dst, "", unix.MS_BIND, ""); err != nil {
		return fmt.Errorf("mounting %s on %s: %w", src, dst, err)
	}
	if shared {
		return unix.Mount("", dst, "", unix.MS_SHARED, "")
	}
	return nil
}

// isMountPoint reports whether dir is a mount point (its device differs
// from its parent's).
func isMountPoint(dir string) (bool, error) {
	var a, b unix.Stat_t
	if err := unix.Stat(dir, &a); err != nil {
		return false, err
	}
	if err := unix.Stat(filepath.Dir(dir), &b); err != nil {
		return false, err
	}
	return a.Dev != b.Dev, nil
}

// machineID writes /run/machine-id (the system image links
// /etc/machine-id there) from the node ID's 32 hex digits: stable for the
// node, unique in the cluster.
func machineID(nodeID string) error {
	id := strings.TrimPrefix(nodeID, "plinth-")
	if len(id) != 32 {
		return fmt.Errorf("node ID %q does not make a machine ID", nodeID)
	}
	return os.WriteFile("/run/machine-id", []byte(id+"\n"), 0o444)
}

// dnsLink is the dummy interface carrying ClusterDNSIP.
const dnsLink = "plinth-dns"

// dnsAddress puts ClusterDNSIP on a dummy interface, so the node's DNS
// server can bind it and pods reach it through their default route.
func dnsAddress() error {
	link, err := netlink.LinkByName(dnsLink)
	if err != nil {
		var nf netlink.LinkNotFoundError
		if !errors.As(err, &nf) {
			return err
		}
		if err := netlink.LinkAdd(&netlink.Dummy{LinkAttrs: netlink.LinkAttrs{Name: dnsLink}}); err != nil {
			return fmt.Errorf("creating %s: %w", dnsLink, err)
		}
		if link, err = netlink.LinkByName(dnsLink); err != nil {
			return err
		}
	}
	addr, err := netlink.ParseAddr(layout.ClusterDNSIP + "/32")
	if err != nil {
		return err
	}
	if err := netlink.AddrReplace(link, addr); err != nil {
		return fmt.Errorf("address %s on %s: %w", addr, dnsLink, err)
	}
	return netlink.LinkSetUp(link)
}
