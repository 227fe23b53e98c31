package curator

import (
	"context"
	"crypto/ed25519"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"math/big"
	"net"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"plinth.dev/plinth/api/clusterpb"
	"plinth.dev/plinth/platform/pki"
	"plinth.dev/plinth/roleserver/rpc"
)

// IssueCertificate signs the kubelet's certificates with the Kubernetes
// CA, a CA of its own (created on first use, kept in etcd) so that cluster
// node certificates mean nothing to the API server and the reverse.
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
	for name, k := range map[string][]byte{"kubelet_client_public_key": w.KubeletClientPublicKey, "kubelet_server_public_key": w.KubeletServerPublicKey} {
		if len(k) != ed25519.PublicKeySize {
			return nil, status.Errorf(codes.InvalidArgument, "%s has %d bytes, want %d", name, len(k), ed25519.PublicKeySize)
		}
	}
	ca, err := kubernetesCA(ctx, kv)
	if err != nil {
		return nil, err
	}
	clientCert, err := issueKubernetes(ca, w.KubeletClientPublicKey, &x509.Certificate{
		Subject:     pkix.Name{CommonName: "system:node:" + n.Id, Organization: []string{"system:nodes"}},
		ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth},
	})
	if err != nil {
		return nil, internalErr("issuing kubelet client certificate", err)
	}
	server := &x509.Certificate{
		Subject:     pkix.Name{CommonName: n.Id},
		DNSNames:    []string{n.Id},
		ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
	}
	for _, a := range n.GetStatus().GetAddresses() {
		if ip := net.ParseIP(a); ip != nil {
			server.IPAddresses = append(server.IPAddresses, ip)
		}
	}
	serverCert, err := issueKubernetes(ca, w.KubeletServerPublicKey, server)
	if err != nil {
		return nil, internalErr("issuing kubelet server certificate", err)
	}
	return &clusterpb.IssueCertificateResponse{Kind: &clusterpb.IssueCertificateResponse_KubernetesWorker_{
		KubernetesWorker: &clusterpb.IssueCertificateResponse_KubernetesWorker{
			IdentityCaCertificate:    ca.Certificate.Raw,
			KubeletClientCertificate: clientCert.Raw,
			KubeletServerCertificate: serverCert.Raw,
		},
	}}, nil
}

// kubernetesCA loads the Kubernetes CA, creating it on first use. Of two
// concurrent creators, the first to commit wins and the other uses its CA.
func kubernetesCA(ctx context.Context, kv clientv3.KV) (*pki.CA, error) {
	resp, err := kv.Txn(ctx).Then(clientv3.OpGet(keyK8sCACert), clientv3.OpGet(keyK8sCAKey)).Commit()
	if err != nil {
		return nil, etcdErr("reading the Kubernetes CA", err)
	}
	if c, k := resp.Responses[0].GetResponseRange().Kvs, resp.Responses[1].GetResponseRange().Kvs; len(c) == 1 && len(k) == 1 {
		ca, err := pki.LoadCA(c[0].Value, k[0].Value)
		if err != nil {
			return nil, internalErr("loading the Kubernetes CA", err)
		}
		return ca, nil
	}
	ca, err := pki.NewCA("Plinth Kubernetes CA", 0)
	if err != nil {
		return nil, internalErr("creating the Kubernetes CA", err)
	}
	certPEM, keyPEM, err := ca.MarshalPEM()
	if err != nil {
		return nil, internalErr("encoding the Kubernetes CA", err)
	}
	put, err := kv.Txn(ctx).If(clientv3.Compare(clientv3.CreateRevision(keyK8sCACert), "=", 0)).
		Then(clientv3.OpPut(keyK8sCACert, string(certPEM)), clientv3.OpPut(keyK8sCAKey, string(keyPEM))).
		Commit()
	if err != nil {
		return nil, etcdErr("storing the Kubernetes CA", err)
	}
	if !put.Succeeded {
		return kubernetesCA(ctx, kv)
	}
	return ca, nil
}

func issueKubernetes(ca *pki.CA, pub ed25519.PublicKey, tmpl *x509.Certificate) (*x509.Certificate, error) {
	serial, err := rand.Int(rand.Reader, new(big.Int).Lsh(big.NewInt(1), 127))
	if err != nil {
		return nil, err
	}
	now := time.Now()
	tmpl.SerialNumber = serial
	tmpl.NotBefore = now.Add(-time.Hour)
	tmpl.NotAfter = ca.Certificate.NotAfter
	tmpl.BasicConstraintsValid = true
	tmpl.KeyUsage = x509.KeyUsageDigitalSignature
	der, err := x509.CreateCertificate(rand.Reader, tmpl, ca.Certificate, pub, ca.Key)
	if err != nil {
		return nil, err
	}
	return x509.ParseCertificate(der)
}
