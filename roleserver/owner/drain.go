package owner

import (
	"bytes"
	"context"
	"crypto"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"slices"
	"time"
)

// KubeAPI is the little of the Kubernetes API the owner's tools need to
// take a worker out of service for an update (cordon, drain, uncordon),
// spoken directly as REST with a short-lived administrator certificate
// (k8s.io/client-go is not linked into plinthctl for this).
type KubeAPI struct {
	Server string // https://host:port
	HTTP   *http.Client
}

// kubeServerName is a name in every API server's certificate.
const kubeServerName = "kubernetes.default.svc"

// KubeAPI returns a client of the cluster's Kubernetes API with a new
// one-hour administrator certificate; server (host:port) overrides the
// first API server the cluster names.
func (c *Client) KubeAPI(ctx context.Context, server string) (*KubeAPI, error) {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, err
	}
	kc, err := c.KubernetesCredentials(ctx, key.Public())
	if err != nil {
		return nil, err
	}
	if server == "" {
		if len(kc.APIServers) == 0 {
			return nil, errors.New("the cluster has no Kubernetes API server (no node has the KubernetesController role)")
		}
		server = kc.APIServers[0]
	}
	return NewKubeAPI(kc, key, server), nil
}

// NewKubeAPI is a client of the API server at server (host:port) with
// the credentials kc issued for key.
func NewKubeAPI(kc *KubernetesCredentials, key crypto.Signer, server string) *KubeAPI {
	roots := x509.NewCertPool()
	roots.AddCert(kc.CA)
	tr := &http.Transport{TLSClientConfig: &tls.Config{
		RootCAs: roots, ServerName: kubeServerName, MinVersion: tls.VersionTLS12,
		Certificates: []tls.Certificate{{Certificate: [][]byte{kc.Certificate.Raw}, PrivateKey: key, Leaf: kc.Certificate}},
	}}
	return &KubeAPI{Server: "https://" + server, HTTP: &http.Client{Transport: tr, Timeout: 30 * time.Second}}
}

// ErrAPINotServing is what Ready returns (wrapped) for an API server
// that does not serve yet: nothing answers at its address, the
// connection is reset (a forwarded port whose node listens on nothing
// yet), a request times out (an API server still starting on a loaded
// machine), or /readyz says it is not ready.
var ErrAPINotServing = errors.New("the API server is not serving yet")

// readyTimeout bounds each of Ready's requests.
const readyTimeout = 10 * time.Second

// Ready asks the API server's /readyz whether it serves requests. It
// returns nil when it does, an error wrapping ErrAPINotServing when it
// does not (yet), and any other error (a refused certificate, a name that
// does not resolve) as it is.
func (k *KubeAPI) Ready(ctx context.Context) error {
	rctx, cancel := context.WithTimeout(ctx, readyTimeout)
	defer cancel()
	req, err := http.NewRequestWithContext(rctx, http.MethodGet, k.Server+"/readyz", nil)
	if err != nil {
		return err
	}
	resp, err := k.HTTP.Do(req)
	if err != nil {
		return k.notServing(err)
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(io.LimitReader(resp.Body, 4<<10))
	switch {
	case resp.StatusCode == http.StatusUnauthorized:
		return fmt.Errorf("kubernetes: %s/readyz: %s: %s", k.Server, resp.Status, bytes.TrimSpace(body))
	case resp.StatusCode == http.StatusForbidden:
		// /readyz is open to every authenticated user once the API
		// server's default roles exist: it is still making them.
		return fmt.Errorf("%w (%s/readyz: %s: its default roles do not exist yet)", ErrAPINotServing, k.Server, resp.Status)
	case resp.StatusCode != http.StatusOK:
		return fmt.Errorf("%w (%s/readyz: %s)", ErrAPINotServing, k.Server, resp.Status)
	}
	// Ready, and the owner's certificate has its rights: the controller
	// binds cluster-admin to the owner's group once its API server serves.
	// And pods can be made: the controller manager (which starts after
	// the API server, and takes a while under TCG) has made the default
	// namespace's service account, without which the API refuses pods.
	sctx, cancel := context.WithTimeout(ctx, readyTimeout)
	defer cancel()
	status, err := k.do(sctx, http.MethodGet, "/api/v1/namespaces/default/serviceaccounts/default", "", nil, nil)
	switch {
	case status == http.StatusForbidden:
		return fmt.Errorf("%w (it serves, but has not bound the owner's group to cluster-admin yet)", ErrAPINotServing)
	case status == http.StatusNotFound:
		return fmt.Errorf("%w (it serves, but the controller manager has not made the default service account yet: no pod can be created before it has)", ErrAPINotServing)
	case status == http.StatusTooManyRequests || status >= 500:
		// Still starting: priority and fairness refusing, or a request
		// that timed out inside it.
		return fmt.Errorf("%w (%v)", ErrAPINotServing, err)
	case err != nil:
		return k.notServing(err)
	}
	return nil
}

// notServing wraps a request's transport error in ErrAPINotServing when
// it is what an API server that is not serving yet gives: nothing
// listening, a connection reset or cut short, no answer in time. Other
// errors (a refused certificate, a name that does not resolve) stay as
// they are.
func (k *KubeAPI) notServing(err error) error {
	var op *net.OpError
	var timeout net.Error
	if errors.As(err, &op) || errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) || errors.Is(err, context.DeadlineExceeded) ||
		(errors.As(err, &timeout) && timeout.Timeout()) {
		return fmt.Errorf("%w (%s: %v)", ErrAPINotServing, k.Server, err)
	}
	return err
}

// do sends a request with a JSON body (nil: none) and decodes a JSON
// answer into out (nil: discarded). A status other than 2xx is an error
// carrying the API's message; the status is returned either way.
func (k *KubeAPI) do(ctx context.Context, method, path, contentType string, body, out any) (status int, err error) {
	var r io.Reader
	if body != nil {
		b, err := json.Marshal(body)
		if err != nil {
			return 0, err
		}
		r = bytes.NewReader(b)
	}
	req, err := http.NewRequestWithContext(ctx, method, k.Server+path, r)
	if err != nil {
		return 0, err
	}
	if body != nil {
		req.Header.Set("Content-Type", contentType)
	}
	req.Header.Set("Accept", "application/json")
	resp, err := k.HTTP.Do(req)
	if err != nil {
		return 0, err
	}
	defer resp.Body.Close()
	data, err := io.ReadAll(io.LimitReader(resp.Body, 16<<20))
	if err != nil {
		return resp.StatusCode, err
	}
	if resp.StatusCode/100 != 2 {
		var st struct {
			Message string `json:"message"`
		}
		json.Unmarshal(data, &st)
		return resp.StatusCode, fmt.Errorf("kubernetes: %s %s: %s: %s", method, path, resp.Status, st.Message)
	}
	if out != nil {
		return resp.StatusCode, json.Unmarshal(data, out)
	}
	return resp.StatusCode, nil
}

// Cordon marks node unschedulable (on) or schedulable again (!on).
func (k *KubeAPI) Cordon(ctx context.Context, node string, on bool) error {
	_, err := k.do(ctx, http.MethodPatch, "/api/v1/nodes/"+url.PathEscape(node), "application/merge-patch+json",
		map[string]any{"spec": map[string]any{"unschedulable": on}}, nil)
	return err
}

// ControlPlaneTaint is the taint that keeps pods off a controller that
// is also a worker (Kubernetes' own key for control plane nodes).
const ControlPlaneTaint = "node-role.kubernetes.io/control-plane"

// Taint puts the NoSchedule ControlPlaneTaint on node (on) or takes it
// away (!on), leaving its other taints. Pods that tolerate it (DaemonSets
// of the cluster's own) still run there.
func (k *KubeAPI) Taint(ctx context.Context, node string, on bool) error {
	for {
		status, err := k.taint(ctx, node, on)
		if status != http.StatusConflict {
			return err
		}
		// The Node changed between the read and the write (its status
		// is written every few seconds): read it again.
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(100 * time.Millisecond):
		}
	}
}

func (k *KubeAPI) taint(ctx context.Context, node string, on bool) (int, error) {
	type taint struct {
		Key    string `json:"key"`
		Value  string `json:"value,omitempty"`
		Effect string `json:"effect"`
	}
	var n struct {
		Metadata struct {
			ResourceVersion string `json:"resourceVersion"`
		} `json:"metadata"`
		Spec struct {
			Taints []taint `json:"taints"`
		} `json:"spec"`
	}
	path := "/api/v1/nodes/" + url.PathEscape(node)
	if status, err := k.do(ctx, http.MethodGet, path, "", nil, &n); err != nil {
		return status, err
	}
	taints := slices.DeleteFunc(n.Spec.Taints, func(t taint) bool { return t.Key == ControlPlaneTaint && t.Effect == "NoSchedule" })
	if on {
		taints = append(taints, taint{Key: ControlPlaneTaint, Effect: "NoSchedule"})
	}
	if taints == nil {
		taints = []taint{}
	}
	// The resource version makes a concurrent change of the taints a
	// conflict instead of lost.
	return k.do(ctx, http.MethodPatch, path, "application/merge-patch+json",
		map[string]any{"metadata": map[string]any{"resourceVersion": n.Metadata.ResourceVersion}, "spec": map[string]any{"taints": taints}}, nil)
}

// NodeReady reports the node's Ready condition: whether its kubelet
// reports it able to run pods, and the condition's reason when not.
func (k *KubeAPI) NodeReady(ctx context.Context, node string) (ready bool, reason string, err error) {
	var n struct {
		Status struct {
			Conditions []struct{ Type, Status, Reason string } `json:"conditions"`
		} `json:"status"`
	}
	if _, err := k.do(ctx, http.MethodGet, "/api/v1/nodes/"+url.PathEscape(node), "", nil, &n); err != nil {
		return false, "", err
	}
	for _, c := range n.Status.Conditions {
		if c.Type == "Ready" {
			return c.Status == "True", c.Reason, nil
		}
	}
	return false, "no Ready condition yet", nil
}

type podList struct {
	Items []pod `json:"items"`
}

type pod struct {
	Metadata struct {
		Name            string            `json:"name"`
		Namespace       string            `json:"namespace"`
		Annotations     map[string]string `json:"annotations"`
		OwnerReferences []struct {
			Kind string `json:"kind"`
		} `json:"ownerReferences"`
	} `json:"metadata"`
}

// evictable: not a DaemonSet's pod (the DaemonSet would put it back at
// once) and not a static pod (the kubelet's own, from its manifests).
func (p pod) evictable() bool {
	if _, mirror := p.Metadata.Annotations["kubernetes.io/config.mirror"]; mirror {
		return false
	}
	for _, o := range p.Metadata.OwnerReferences {
		if o.Kind == "DaemonSet" {
			return false
		}
	}
	return true
}

func (k *KubeAPI) podsOn(ctx context.Context, node string) ([]pod, error) {
	var l podList
	_, err := k.do(ctx, http.MethodGet, "/api/v1/pods?fieldSelector="+url.QueryEscape("spec.nodeName="+node), "", nil, &l)
	var out []pod
	for _, p := range l.Items {
		if p.evictable() {
			out = append(out, p)
		}
	}
	return out, err
}

// Drain evicts node's pods (the Eviction API, so PodDisruptionBudgets
// are honoured: an eviction they refuse is retried) and waits until they
// are gone or ctx ends. It returns how many pods it evicted. Cordon the
// node first, or the scheduler may put new pods on it.
func (k *KubeAPI) Drain(ctx context.Context, node string) (int, error) {
	evicted := map[string]bool{}
	for {
		pods, err := k.podsOn(ctx, node)
		if err != nil {
			return len(evicted), err
		}
		if len(pods) == 0 {
			return len(evicted), nil
		}
		for _, p := range pods {
			id := p.Metadata.Namespace + "/" + p.Metadata.Name
			ev := map[string]any{"apiVersion": "policy/v1", "kind": "Eviction",
				"metadata": map[string]any{"name": p.Metadata.Name, "namespace": p.Metadata.Namespace}}
			status, err := k.do(ctx, http.MethodPost, "/api/v1/namespaces/"+url.PathEscape(p.Metadata.Namespace)+"/pods/"+url.PathEscape(p.Metadata.Name)+"/eviction",
				"application/json", ev, nil)
			switch {
			case err == nil:
				evicted[id] = true
			case status == http.StatusNotFound:
				// Gone meanwhile.
			case status == http.StatusTooManyRequests:
				// A disruption budget says not now: try again below.
			default:
				return len(evicted), err
			}
		}
		select {
		case <-ctx.Done():
			return len(evicted), fmt.Errorf("draining %s: %d pods still there: %w", node, len(pods), ctx.Err())
		case <-time.After(2 * time.Second):
		}
	}
}
