package kubernetes

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"net"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"time"

	"plinth.dev/plinth/platform/layout"
	"plinth.dev/plinth/platform/supervisor"
	"plinth.dev/plinth/roleserver/kubernetes/pki"
)

// The resource metrics API (metrics.k8s.io: kubectl top, the
// HorizontalPodAutoscaler) is metrics-server, run by every controller
// as a component of its own (kube metrics-server, its own user and
// certificates) on the node's address, not as a pod: it is there as soon
// as the control plane is, needs no image, and a controller that is not a
// worker serves it all the same. The API servers aggregate it:
//
//	kubectl top ──► any API server ──(front-proxy client certificate,
//	                  │               --enable-aggregator-routing: straight to an endpoint)
//	                  ▼
//	  APIService v1beta1.metrics.k8s.io ─► Service kube-system/metrics-server (no selector)
//	                                        EndpointSlice metrics-server-<node> per controller,
//	                                        ready while its metrics server answers /livez
//	                                        (its controller says so; any other controller
//	                                        that finds it silent marks it not ready)
//	                  ▼
//	  metrics-server on <controller>:layout.MetricsServerPort (serving cert of the Kubernetes
//	                  │  CA for metrics-server.kube-system.svc: the APIService's caBundle)
//	                  ▼ every metricResolution, as pki.MetricsServerUser (nodes/metrics)
//	  every kubelet's /metrics/resource (its serving certificate checked against the kubelet CA)
//
// Each controller's metrics server scrapes every kubelet itself, so any
// one of them answers alone; the aggregator picks a ready endpoint at
// random.

// Files of the metrics server, in its directory.
const (
	fileMetricsServer     = "metrics-server.kubeconfig"
	fileMetricsServingKey = "metrics-serving-key.pem"
	fileMetricsServing    = "metrics-serving.pem"
)

// metricResolution is how often the metrics servers scrape the kubelets
// (metrics-server's least is 10 s, its default a minute): a CPU rate
// needs two scrapes, so a new pod's metrics (and the autoscaler's first
// decision) come after about twice this.
const metricResolution = 15 * time.Second

// kubeletScrapeTimeout bounds each scrape of a kubelet (metrics-server's
// default is 10 s, its most nine tenths of metricResolution). A node's
// usage needs two scrapes in a row: one that fails starts it over, so
// a loaded kubelet that answers in 11 s would be missing from kubectl
// top for as long as it stays loaded.
const kubeletScrapeTimeout = 13 * time.Second

// metricsServerFiles are the metrics server's: the kubeconfig of its
// client credential (the API servers and kubelets alike), its serving
// certificate, and the CAs that check clients (the aggregators' front
// proxy and direct clients) and kubelets.
func metricsServerFiles(c *pki.ControllerCredentials) files {
	return files{
		fileCA:                c.CACertificate,
		fileFrontProxyCA:      c.FrontProxyCACertificate,
		fileKubeletServingCA:  c.KubeletServingCACertificate,
		fileMetricsServer:     kubeconfig(apiServerLocalEndpoint, "", c.CACertificate, c.MetricsServer.Certificate, c.MetricsServer.Key),
		fileMetricsServing:    c.MetricsServing.Certificate,
		fileMetricsServingKey: c.MetricsServing.Key,
	}
}

// metricsServerArgs are metrics-server's flags. The client CAs are
// given, not looked up in the cluster (the configmap
// extension-apiserver-authentication), so it needs no right to read it;
// requests are authorized by the API servers (SubjectAccessReview).
func metricsServerArgs(f map[string]string) []string {
	return []string{
		"metrics-server",
		"--bind-address=0.0.0.0",
		"--secure-port=" + strconv.Itoa(layout.MetricsServerPort),
		"--tls-cert-file=" + f[fileMetricsServing],
		"--tls-private-key-file=" + f[fileMetricsServingKey],
		"--kubeconfig=" + f[fileMetricsServer],
		"--authentication-kubeconfig=" + f[fileMetricsServer],
		"--authorization-kubeconfig=" + f[fileMetricsServer],
		"--client-ca-file=" + f[fileCA],
		"--requestheader-client-ca-file=" + f[fileFrontProxyCA],
		"--requestheader-allowed-names=front-proxy-client",
		"--requestheader-extra-headers-prefix=X-Remote-Extra-",
		"--requestheader-group-headers=X-Remote-Group",
		"--requestheader-username-headers=X-Remote-User",
		"--kubelet-certificate-authority=" + f[fileKubeletServingCA],
		"--kubelet-preferred-address-types=InternalIP",
		"--kubelet-use-node-status-port",
		"--metric-resolution=" + metricResolution.String(),
		"--kubelet-request-timeout=" + kubeletScrapeTimeout.String(),
		"--profiling=false",
		"--v=0",
	}
}

// metricsLive checks a metrics server's /livez (open to anonymous
// callers) at ip: it serves, whether or not it has scraped enough yet
// (its /readyz waits for metrics of pods, which a cluster may not have).
// Its certificate is checked against the Kubernetes CA (caPEM); one
// connection per check, none kept.
func metricsLive(caPEM []byte) func(ctx context.Context, ip string) error {
	pool := x509.NewCertPool()
	pool.AppendCertsFromPEM(caPEM)
	client := &http.Client{Timeout: 10 * time.Second, Transport: &http.Transport{DisableKeepAlives: true,
		TLSClientConfig: &tls.Config{RootCAs: pool, ServerName: pki.MetricsService + ".kube-system.svc", MinVersion: tls.VersionTLS12}}}
	return func(ctx context.Context, ip string) error {
		return getOK(ctx, client, "https://"+net.JoinHostPort(ip, strconv.Itoa(layout.MetricsServerPort))+"/livez")
	}
}

// metricsAPIObjects are the APIService and its Service, the metrics
// servers' serving certificates checked against the Kubernetes CA
// (caPEM).
func metricsAPIObjects(caPEM []byte) []rbacObject {
	return []rbacObject{
		{path: "/api/v1/namespaces/kube-system/services/" + pki.MetricsService, body: `{
  "apiVersion": "v1", "kind": "Service",
  "metadata": {"name": "` + pki.MetricsService + `", "namespace": "kube-system"},
  "spec": {"ports": [{"name": "https", "port": 443, "protocol": "TCP", "targetPort": ` + strconv.Itoa(layout.MetricsServerPort) + `}]}}`},
		{path: "/apis/apiregistration.k8s.io/v1/apiservices/v1beta1.metrics.k8s.io", body: `{
  "apiVersion": "apiregistration.k8s.io/v1", "kind": "APIService",
  "metadata": {"name": "v1beta1.metrics.k8s.io"},
  "spec": {"group": "metrics.k8s.io", "version": "v1beta1", "groupPriorityMinimum": 100, "versionPriority": 100,
    "service": {"namespace": "kube-system", "name": "` + pki.MetricsService + `", "port": 443},
    "caBundle": "` + base64.StdEncoding.EncodeToString(caPEM) + `"}}`},
	}
}

// metricsEndpoint is controller nodeID's EndpointSlice of the metrics
// Service: its address, ready or not.
func metricsEndpoint(nodeID string, addr net.IP, ready bool) rbacObject {
	return rbacObject{path: metricsSlicePath(nodeID), body: `{
  "apiVersion": "discovery.k8s.io/v1", "kind": "EndpointSlice",
  "metadata": {"name": "` + metricsSliceName(nodeID) + `", "namespace": "kube-system",
    "labels": {"kubernetes.io/service-name": "` + pki.MetricsService + `", "endpointslice.kubernetes.io/managed-by": "` + metricsSliceManager + `"}},
  "addressType": "IPv4",
  "endpoints": [{"addresses": ["` + addr.String() + `"], "conditions": {"ready": ` + strconv.FormatBool(ready) + `}}],
  "ports": [{"name": "https", "port": ` + strconv.Itoa(layout.MetricsServerPort) + `, "protocol": "TCP"}]}`}
}

// metricsSliceManager marks the metrics Service's EndpointSlices as
// Plinth's (the endpoint slice controllers leave them alone).
const metricsSliceManager = "metrics-server.plinth.dev"

func metricsSliceName(nodeID string) string { return pki.MetricsService + "-" + nodeID }

func metricsSlicePath(nodeID string) string {
	return "/apis/discovery.k8s.io/v1/namespaces/kube-system/endpointslices/" + metricsSliceName(nodeID)
}

// metricsProbe is how often a controller checks the metrics servers
// and says so in their EndpointSlices.
const metricsProbe = 10 * time.Second

// metricsAPI is the runnable that registers the metrics API (the
// APIService and its Service) and keeps the metrics Service's
// EndpointSlices true: every metricsProbe this controller's says whether
// its own metrics server answers, and another controller's whose metrics
// server does not answer here is marked not ready (only its own
// controller marks it ready again), so a controller that lost its power
// is out of the aggregator's choice within seconds, not until it is
// back. This controller's slice goes when it stops.
func metricsAPI(p *pki.PKI, nodeID string, addr net.IP, server string, caPEM []byte) supervisor.Runnable {
	return func(ctx context.Context) error {
		if err := applyObjects(ctx, p, nodeID, server, metricsAPIObjects(caPEM)); err != nil {
			return err
		}
		defer func() {
			// A clean stop takes this endpoint out at once.
			dctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 10*time.Second)
			defer cancel()
			if err := deleteObject(dctx, p, nodeID, server, metricsSlicePath(nodeID)); err != nil {
				supervisor.Logger(ctx).Warn("removing this controller's metrics endpoint", "err", err)
			}
		}()
		supervisor.Signal(ctx, supervisor.SignalHealthy)
		live := metricsLive(caPEM)
		for {
			if err := checkMetricsEndpoints(ctx, p, nodeID, addr, server, live); err != nil {
				return err
			}
			select {
			case <-ctx.Done():
				return ctx.Err()
			case <-time.After(metricsProbe):
			}
		}
	}
}

// metricsSlice is what checkMetricsEndpoints reads of an EndpointSlice.
type metricsSlice struct {
	Metadata struct {
		Name string `json:"name"`
	} `json:"metadata"`
	Endpoints []struct {
		Addresses  []string `json:"addresses"`
		Conditions struct {
			Ready *bool `json:"ready"`
		} `json:"conditions"`
	} `json:"endpoints"`
}

// checkMetricsEndpoints probes the metrics servers and corrects their
// EndpointSlices (see metricsAPI).
func checkMetricsEndpoints(ctx context.Context, p *pki.PKI, nodeID string, addr net.IP, server string, probe func(context.Context, string) error) error {
	client, err := adminClient(ctx, p, nodeID)
	if err != nil {
		return err
	}
	defer client.CloseIdleConnections()
	b, err := apiDo(ctx, client, http.MethodGet, server+"/apis/discovery.k8s.io/v1/namespaces/kube-system/endpointslices?labelSelector="+
		url.QueryEscape("endpointslice.kubernetes.io/managed-by="+metricsSliceManager), "", "")
	if err != nil {
		return err
	}
	var list struct {
		Items []metricsSlice `json:"items"`
	}
	if err := json.Unmarshal(b, &list); err != nil {
		return fmt.Errorf("the metrics EndpointSlices: %w", err)
	}
	live := func(ip string) bool { return probe(ctx, ip) == nil }
	log := supervisor.Logger(ctx)
	own := metricsSliceName(nodeID)
	ownFound := false
	for _, sl := range list.Items {
		if len(sl.Endpoints) != 1 || len(sl.Endpoints[0].Addresses) != 1 {
			continue
		}
		ip := sl.Endpoints[0].Addresses[0]
		said := sl.Endpoints[0].Conditions.Ready == nil || *sl.Endpoints[0].Conditions.Ready
		if sl.Metadata.Name == own {
			ownFound = true
			if ready := live(addr.String()); ready != said || ip != addr.String() {
				if err := serverSideApply(ctx, client, server+metricsSlicePath(nodeID), metricsEndpoint(nodeID, addr, ready).body, true); err != nil {
					return err
				}
				log.Info("this controller's metrics endpoint", "ready", ready)
			}
			continue
		}
		peer, ok := strings.CutPrefix(sl.Metadata.Name, pki.MetricsService+"-")
		if !ok || !said || live(ip) {
			continue
		}
		if err := serverSideApply(ctx, client, server+metricsSlicePath(peer), metricsEndpoint(peer, net.ParseIP(ip), false).body, true); err != nil {
			return err
		}
		log.Warn("another controller's metrics server does not answer: its endpoint marked not ready", "node", peer, "address", ip)
	}
	if !ownFound {
		ready := live(addr.String())
		if err := serverSideApply(ctx, client, server+metricsSlicePath(nodeID), metricsEndpoint(nodeID, addr, ready).body, true); err != nil {
			return err
		}
		log.Info("this controller's metrics endpoint", "ready", ready)
	}
	return nil
}

// deleteObject deletes the object at path through server as the
// break-glass user (adminClient); one already gone is no error.
func deleteObject(ctx context.Context, p *pki.PKI, nodeID, server, path string) error {
	client, err := adminClient(ctx, p, nodeID)
	if err != nil {
		return err
	}
	defer client.CloseIdleConnections()
	_, err = apiDo(ctx, client, http.MethodDelete, server+path, "", "")
	return err
}
