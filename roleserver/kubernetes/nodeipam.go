package kubernetes

import (
	"cmp"
	"context"
	"crypto/ed25519"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"slices"
	"strings"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"plinth.dev/plinth/platform/supervisor"
	"plinth.dev/plinth/roleserver/kubernetes/pki"
	"plinth.dev/plinth/roleserver/kubernetes/podcidr"
)

// The node IPAM gives every Node without a pod CIDR one (spec.podCIDR,
// which netd configures the node's pod network from and routes to), in
// the controller's core instead of the controller manager:
//
//	kubelet registers Node ──► API server ──watch──► nodeipam (every controller)
//	                                                   │ podcidr.Allocate: the CIDR the
//	                                                   │ curator gave the worker already
//	netd ◄──watch── API server ◄──PATCH spec.podCIDR───┘
//
// Why: the controller manager sets a pod CIDR only once it has built
// every one of its controllers and started their informers — under TCG
// ~16 s after the API server serves, while the kubelet has registered
// its Node ~6 s after (Node Ready waited for the controller manager; see
// the README's "Where the start goes"). The core's IPAM is running when
// the API server starts serving and answers a new Node at once.
//
// Allocations are the podcidr package's, the same the curator hands
// workers with their certificates: a Node gets the CIDR its worker
// already configured its pod network with. Pod CIDRs Nodes already have
// (the controller manager's, from before) are recorded and never handed
// out again.

// ipamValidity is how long the IPAM's client certificate lasts; the
// runnable restarts with a new one before then.
const ipamValidity = time.Hour

// ipamNode is what the IPAM reads of a Node.
type ipamNode struct {
	Metadata struct {
		Name            string `json:"name"`
		ResourceVersion string `json:"resourceVersion"`
	} `json:"metadata"`
	Spec struct {
		PodCIDR string `json:"podCIDR"`
	} `json:"spec"`
}

// nodeIPAM is the IPAM's runnable: server is the local API server, kv
// the curator's namespace (allocations and the Kubernetes PKI).
func nodeIPAM(kv clientv3.KV, server string) supervisor.Runnable {
	return func(ctx context.Context) error {
		pub, key, err := ed25519.GenerateKey(rand.Reader)
		if err != nil {
			return err
		}
		ca, cert, err := pki.New(kv).NodeIPAM(ctx, pub, ipamValidity)
		if err != nil {
			return fmt.Errorf("node IPAM credentials: %w", err)
		}
		pool := x509.NewCertPool()
		pool.AddCert(ca)
		ipam := &ipam{kv: kv, server: server, client: &http.Client{Transport: &http.Transport{TLSClientConfig: &tls.Config{
			RootCAs: pool, MinVersion: tls.VersionTLS12,
			Certificates: []tls.Certificate{{Certificate: [][]byte{cert.Raw}, PrivateKey: key}},
		}}}}
		supervisor.Signal(ctx, supervisor.SignalHealthy)
		ctx, cancel := context.WithTimeout(ctx, ipamValidity/2)
		defer cancel()
		for ctx.Err() == nil {
			if err := ipam.run(ctx); err != nil && ctx.Err() == nil {
				// Plinth's RBAC may not be applied yet at the first start.
				supervisor.Logger(ctx).Warn("node IPAM", "err", err)
				select {
				case <-ctx.Done():
				case <-time.After(time.Second):
				}
			}
		}
		if err := context.Cause(ctx); errors.Is(err, context.DeadlineExceeded) {
			return fmt.Errorf("node IPAM: new credentials: %w", supervisor.ErrRestart)
		}
		return ctx.Err()
	}
}

type ipam struct {
	kv     clientv3.KV
	server string
	client *http.Client
	// known are the allocations as last read or written (node → CIDR).
	known map[string]string
}

// run lists the Nodes, gives those without a pod CIDR one, and then
// does so for every Node the watch from there shows, until it ends.
func (p *ipam) run(ctx context.Context) error {
	var list struct {
		Metadata struct {
			ResourceVersion string `json:"resourceVersion"`
		} `json:"metadata"`
		Items []ipamNode `json:"items"`
	}
	if err := p.get(ctx, "/api/v1/nodes", &list); err != nil {
		return err
	}
	// Those with a CIDR first: their CIDRs are taken.
	without := func(n ipamNode) int {
		if n.Spec.PodCIDR == "" {
			return 1
		}
		return 0
	}
	slices.SortStableFunc(list.Items, func(a, b ipamNode) int { return cmp.Compare(without(a), without(b)) })
	for _, n := range list.Items {
		if err := p.ensure(ctx, n); err != nil {
			return err
		}
	}
	q := url.Values{"watch": {"1"}, "resourceVersion": {list.Metadata.ResourceVersion}, "timeoutSeconds": {"300"}}
	body, err := p.open(ctx, "/api/v1/nodes?"+q.Encode())
	if err != nil {
		return err
	}
	defer body.Close()
	dec := json.NewDecoder(body)
	for {
		var ev struct {
			Type   string   `json:"type"`
			Object ipamNode `json:"object"`
		}
		if err := dec.Decode(&ev); err != nil {
			if errors.Is(err, io.EOF) {
				return nil // the watch's timeout: list again
			}
			return fmt.Errorf("watching Nodes: %w", err)
		}
		switch ev.Type {
		case "ADDED", "MODIFIED":
			if err := p.ensure(ctx, ev.Object); err != nil {
				return err
			}
		case "ERROR":
			return nil // e.g. the resource version is too old: list again
		}
	}
}

// ensure gives n a pod CIDR if it has none; one it has (set before this
// IPAM, by the controller manager) is recorded as its allocation, so it
// is never handed out again.
func (p *ipam) ensure(ctx context.Context, n ipamNode) error {
	name := n.Metadata.Name
	if name == "" {
		return nil
	}
	if n.Spec.PodCIDR != "" {
		if p.known[name] == n.Spec.PodCIDR {
			return nil
		}
		known, err := podcidr.Record(ctx, p.kv, name, n.Spec.PodCIDR)
		if err == nil {
			p.known = known
		}
		return err
	}
	cidr, known, err := podcidr.Allocate(ctx, p.kv, name)
	if err != nil {
		return err
	}
	p.known = known
	patch := fmt.Sprintf(`{"spec":{"podCIDR":%q,"podCIDRs":[%q]}}`, cidr, cidr)
	req, err := http.NewRequestWithContext(ctx, http.MethodPatch, p.server+"/api/v1/nodes/"+url.PathEscape(n.Metadata.Name), strings.NewReader(patch))
	if err != nil {
		return err
	}
	req.Header.Set("Content-Type", "application/merge-patch+json")
	resp, err := p.client.Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(io.LimitReader(resp.Body, 512))
	switch {
	case resp.StatusCode == http.StatusOK:
		supervisor.Logger(ctx).Info("pod CIDR set", "node", n.Metadata.Name, "cidr", cidr)
	case resp.StatusCode == http.StatusNotFound:
		// Deleted meanwhile; its allocation stays its own.
	case resp.StatusCode == http.StatusUnprocessableEntity:
		// Another controller (or the Node's creator) set one first: the
		// API refuses to change it, and the watch shows which.
	default:
		return fmt.Errorf("setting %s's pod CIDR: %s: %s", n.Metadata.Name, resp.Status, strings.TrimSpace(string(b)))
	}
	return nil
}

// get decodes a GET of path from the API server into v.
func (p *ipam) get(ctx context.Context, path string, v any) error {
	body, err := p.open(ctx, path)
	if err != nil {
		return err
	}
	defer body.Close()
	return json.NewDecoder(body).Decode(v)
}

// open GETs path from the API server: the body of a 200, else an error
// with the API's message.
func (p *ipam) open(ctx context.Context, path string) (io.ReadCloser, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, p.server+path, nil)
	if err != nil {
		return nil, err
	}
	resp, err := p.client.Do(req)
	if err != nil {
		return nil, err
	}
	if resp.StatusCode != http.StatusOK {
		defer resp.Body.Close()
		b, _ := io.ReadAll(io.LimitReader(resp.Body, 512))
		return nil, fmt.Errorf("GET %s: %s: %s", path, resp.Status, strings.TrimSpace(string(b)))
	}
	return resp.Body, nil
}
