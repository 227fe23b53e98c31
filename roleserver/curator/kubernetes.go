package curator

import (
	"context"
	"crypto/ed25519"
	"errors"
	"net"
	"strconv"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"plinth.dev/plinth/api/clusterpb"
	"plinth.dev/plinth/platform/layout"
	"plinth.dev/plinth/platform/pki"
	kpki "plinth.dev/plinth/roleserver/kubernetes/pki"
	"plinth.dev/plinth/roleserver/kubernetes/podcidr"
	"plinth.dev/plinth/roleserver/rpc"
)

// The Kubernetes PKI (roleserver/kubernetes/pki) lives in the curator's
// etcd namespace under /kubernetes-ca/, apart from the cluster CA, so
// that cluster certificates mean nothing to the API server and the
// reverse. The curator issues from it what nodes and the owner cannot
// issue themselves: the kubelet's certificates and the owner's kubectl
// credentials. Controllers, being consensus members, issue their own
// (kpki.PKI.Controller).

// kubernetesAdminValidity is the lifetime of the owner's kubectl
// certificate: plinthctl asks for a new one when it runs out, and
// Kubernetes cannot revoke it.
const kubernetesAdminValidity = time.Hour

// IssueCertificate signs the kubelet's certificates with the Kubernetes
// CA (created on first use) and hands the worker its pod CIDR (allocated
// on first use, the same the node IPAM sets on its Node). The serving certificate names only the
// caller's node ID (from its certificate, checked against its record by
// checkCaller) and the addresses in its record; the request carries
// nothing but public keys.
func (c curatorServer) IssueCertificate(ctx context.Context, req *clusterpb.IssueCertificateRequest) (*clusterpb.IssueCertificateResponse, error) {
	p := rpc.PeerFrom(ctx)
	if _, err := c.leaderTerm(); err != nil {
		return nil, err
	}
	kv, _, err := c.backend()
	if err != nil {
		return nil, err
	}
	n, err := callerRecord(ctx, kv, p)
	if err != nil {
		return nil, err
	}
	w := req.GetKubernetesWorker()
	if w == nil {
		return nil, status.Error(codes.InvalidArgument, "IssueCertificateRequest.kind is not set")
	}
	if n.GetRoles().GetKubernetesWorker() == nil {
		return nil, status.Errorf(codes.PermissionDenied, "node %s does not have the KubernetesWorker role", p.NodeID)
	}
	for name, k := range map[string][]byte{"kubelet_client_public_key": w.KubeletClientPublicKey,
		"kubelet_server_public_key": w.KubeletServerPublicKey, "proxy_public_key": w.ProxyPublicKey} {
		if err := pki.CheckEd25519PublicKey(k); err != nil {
			return nil, status.Errorf(codes.InvalidArgument, "%s: %v", name, err)
		}
	}
	observed, err := observedAddresses(ctx, kv, n)
	if err != nil {
		return nil, err
	}
	kc, err := kpki.New(kv).Kubelet(ctx, n.Id, observed,
		ed25519.PublicKey(w.KubeletClientPublicKey), ed25519.PublicKey(w.KubeletServerPublicKey))
	if err != nil {
		return nil, kubernetesErr("issuing the kubelet's certificates", err)
	}
	_, proxyCert, err := kpki.New(kv).Proxy(ctx, n.Id, ed25519.PublicKey(w.ProxyPublicKey))
	if err != nil {
		return nil, kubernetesErr("issuing kube-proxy's certificate", err)
	}
	var volumesCert []byte
	if k := w.GetLocalVolumesPublicKey(); len(k) > 0 {
		if err := pki.CheckEd25519PublicKey(k); err != nil {
			return nil, status.Errorf(codes.InvalidArgument, "local_volumes_public_key: %v", err)
		}
		_, c, err := kpki.New(kv).LocalVolumes(ctx, n.Id, ed25519.PublicKey(k))
		if err != nil {
			return nil, kubernetesErr("issuing the local volume provisioner's certificate", err)
		}
		volumesCert = c.Raw
	}
	cidr, _, err := podcidr.Allocate(ctx, kv, n.Id)
	if err != nil {
		return nil, kubernetesErr("allocating the node's pod CIDR", err)
	}
	return &clusterpb.IssueCertificateResponse{Kind: &clusterpb.IssueCertificateResponse_KubernetesWorker_{
		KubernetesWorker: &clusterpb.IssueCertificateResponse_KubernetesWorker{
			IdentityCaCertificate:       kc.CA.Raw,
			KubeletClientCertificate:    kc.Client.Raw,
			KubeletServerCertificate:    kc.Server.Raw,
			ProxyCertificate:            proxyCert.Raw,
			KubeletServingCaCertificate: kc.ServingCA.Raw,
			PodCidr:                     cidr,
			LocalVolumesCertificate:     volumesCert,
		},
	}}, nil
}

// observedAddresses are the addresses the kubelet of node n may serve
// at: those the curator observed it at (Node.observed_addresses, the
// source of its authenticated status pushes), without any that another
// node was observed at too (a node behind the same NAT as another could
// otherwise be certified for the other's address) but a node waiting for
// approval. kpki.Kubelet drops
// what can never be a node's (loopback, the Service and pod ranges). No
// address observed yet is Unavailable: the node pushes its status first
// and asks again.
func observedAddresses(ctx context.Context, kv clientv3.KV, n *clusterpb.Node) ([]net.IP, error) {
	nodes, _, err := listNodes(ctx, kv)
	if err != nil {
		return nil, err
	}
	others := map[string]bool{}
	for _, o := range nodes {
		// Not those of nodes waiting for approval: where they
		// registered from is anyone's to choose who has the ticket.
		if o.GetId() != n.GetId() && o.GetState() != clusterpb.NodeState_NODE_STATE_NEW {
			for _, a := range o.GetObservedAddresses() {
				others[a] = true
			}
		}
	}
	var out []net.IP
	for _, a := range n.GetObservedAddresses() {
		if ip := net.ParseIP(a); ip != nil && !others[a] {
			out = append(out, ip)
		}
	}
	if len(out) == 0 {
		return nil, status.Errorf(codes.Unavailable, "node %s has no address of its own observed yet (it pushes its status first)", n.GetId())
	}
	return out, nil
}

// IssueKubernetesCredentials certifies the owner's key for kubectl: a
// client certificate for a Kubernetes administrator, valid for
// kubernetesAdminValidity, and where the API servers are. The
// interceptor let only the owner through (KUBERNETES_ADMIN).
func (m managementServer) IssueKubernetesCredentials(ctx context.Context, req *clusterpb.IssueKubernetesCredentialsRequest) (*clusterpb.IssueKubernetesCredentialsResponse, error) {
	pub, err := kpki.ParsePublicKey(req.GetPublicKey())
	if err != nil {
		return nil, status.Errorf(codes.InvalidArgument, "public_key: %v", err)
	}
	kv, _, err := m.backend()
	if err != nil {
		return nil, err
	}
	nodes, _, err := listNodes(ctx, kv)
	if err != nil {
		return nil, err
	}
	cfg, err := loadConfiguration(ctx, kv)
	if err != nil {
		return nil, err
	}
	ca, cert, err := kpki.New(kv).Owner(ctx, pub, cfg.GetKubernetesOwnerEpoch(), kubernetesAdminValidity)
	if err != nil {
		return nil, kubernetesErr("issuing the owner's Kubernetes certificate", err)
	}
	return &clusterpb.IssueKubernetesCredentialsResponse{
		CaCertificate:     ca.Raw,
		ClientCertificate: cert.Raw,
		ExpiresUnixNanos:  cert.NotAfter.UnixNano(),
		ApiServers:        apiServers(nodes),
	}, nil
}

// apiServers lists host:port of every address of every UP node with the
// KubernetesController role.
func apiServers(nodes []*clusterpb.Node) []string {
	var out []string
	for _, n := range nodes {
		if n.State != clusterpb.NodeState_NODE_STATE_UP || n.GetRoles().GetKubernetesController() == nil {
			continue
		}
		for _, a := range n.GetStatus().GetAddresses() {
			out = append(out, net.JoinHostPort(a, strconv.Itoa(layout.KubernetesAPIPort)))
		}
	}
	return out
}

// kubernetesErr is the status of a kpki error.
func kubernetesErr(what string, err error) error {
	switch {
	case errors.Is(err, kpki.ErrInvalidArgument):
		return status.Errorf(codes.InvalidArgument, "%s: %v", what, err)
	case errors.Is(err, kpki.ErrStore):
		return status.Errorf(codes.Unavailable, "%s: %v", what, err)
	case errors.Is(err, kpki.ErrRotation):
		return status.Errorf(codes.FailedPrecondition, "%s: %v", what, err)
	}
	return internalErr(what, err)
}

// rotateSteps are the kpki rotation steps of the API's.
var rotateSteps = map[clusterpb.RotateSecretsKeyRequest_Step]string{
	clusterpb.RotateSecretsKeyRequest_STEP_ADD:      kpki.RotateAdd,
	clusterpb.RotateSecretsKeyRequest_STEP_ACTIVATE: kpki.RotateActivate,
	clusterpb.RotateSecretsKeyRequest_STEP_RETIRE:   kpki.RotateRetire,
}

// RotateSecretsKey takes a step of the rotation of the Secrets
// encryption key (see kpki) and reports the keys and the generation each
// UP controller's API server runs with.
func (m managementServer) RotateSecretsKey(ctx context.Context, req *clusterpb.RotateSecretsKeyRequest) (*clusterpb.RotateSecretsKeyResponse, error) {
	kv, _, err := m.backend()
	if err != nil {
		return nil, err
	}
	p := kpki.New(kv)
	var keys *kpki.SecretsKeys
	if step, ok := rotateSteps[req.GetStep()]; ok {
		keys, err = p.RotateSecretsKeys(ctx, step)
	} else if req.GetStep() == clusterpb.RotateSecretsKeyRequest_STEP_STATUS {
		keys, _, err = p.SecretsKeys(ctx)
	} else {
		return nil, status.Errorf(codes.InvalidArgument, "unknown step %v", req.GetStep())
	}
	if err != nil {
		return nil, kubernetesErr("rotating the Secrets encryption key", err)
	}
	loaded, err := p.SecretsLoaded(ctx)
	if err != nil {
		return nil, kubernetesErr("reading what the controllers run with", err)
	}
	nodes, _, err := listNodes(ctx, kv)
	if err != nil {
		return nil, err
	}
	resp := &clusterpb.RotateSecretsKeyResponse{Generation: keys.Generation, Controllers: map[string]uint64{}}
	for _, k := range keys.Keys {
		resp.Keys = append(resp.Keys, &clusterpb.RotateSecretsKeyResponse_Key{Name: k.Name, Write: k.Write})
	}
	for _, n := range nodes {
		if n.GetState() == clusterpb.NodeState_NODE_STATE_UP && n.GetRoles().GetKubernetesController() != nil {
			resp.Controllers[n.GetId()] = loaded[n.GetId()]
		}
	}
	return resp, nil
}
