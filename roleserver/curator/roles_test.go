package curator

import (
	"bytes"
	"crypto/ed25519"
	"crypto/rand"
	"crypto/x509"
	"testing"

	"google.golang.org/grpc/codes"
	"google.golang.org/protobuf/proto"

	"plinth.dev/plinth/api/clusterpb"
	"plinth.dev/plinth/platform/pki"
)

// TestNodeRoles: UpdateNodeRoles refuses what the cluster cannot hold (a
// controller outside consensus, no consensus member left, an unknown
// node); the worker role is what lets a node get its kubelet's
// certificates, from a Kubernetes CA of their own.
func TestNodeRoles(t *testing.T) {
	f := newSingle(t)
	a, ctx := f.a, f.ctx
	b, _ := f.committed("b")
	mg := f.mgmt(a)
	on, off := proto.Bool(true), proto.Bool(false)
	_, err := mg.UpdateNodeRoles(ctx, &clusterpb.UpdateNodeRolesRequest{Node: &clusterpb.UpdateNodeRolesRequest_Id{Id: b.id}, KubernetesController: on})
	wantCode(t, "controller without consensus", err, codes.FailedPrecondition, "ConsensusMember")
	_, err = mg.UpdateNodeRoles(ctx, &clusterpb.UpdateNodeRolesRequest{Node: &clusterpb.UpdateNodeRolesRequest_Id{Id: a.id}, ConsensusMember: off, KubernetesController: off})
	wantCode(t, "removing the last consensus member", err, codes.FailedPrecondition, "last consensus member")
	_, err = mg.UpdateNodeRoles(ctx, &clusterpb.UpdateNodeRolesRequest{Node: &clusterpb.UpdateNodeRolesRequest_Id{Id: "plinth-nosuchnode"}, KubernetesWorker: on})
	wantCode(t, "roles of an unknown node", err, codes.NotFound)

	// IssueCertificate needs the worker role.
	bc := clusterpb.NewCuratorClient(withCreds(t, a.addr(), b.creds))
	clientPub, _, _ := ed25519.GenerateKey(rand.Reader)
	serverPub, _, _ := ed25519.GenerateKey(rand.Reader)
	req := &clusterpb.IssueCertificateRequest{Kind: &clusterpb.IssueCertificateRequest_KubernetesWorker_{
		KubernetesWorker: &clusterpb.IssueCertificateRequest_KubernetesWorker{KubeletClientPublicKey: clientPub, KubeletServerPublicKey: serverPub, ProxyPublicKey: serverPub}}}
	_, err = bc.IssueCertificate(ctx, req)
	wantCode(t, "IssueCertificate without the worker role", err, codes.PermissionDenied, "KubernetesWorker")

	mustOK(t, "UpdateNodeRoles worker", second(mg.UpdateNodeRoles(ctx, &clusterpb.UpdateNodeRolesRequest{
		Node: &clusterpb.UpdateNodeRolesRequest_PublicKey{PublicKey: b.pub()}, KubernetesWorker: on})))
	if n := f.getNode(a, b.id); n.Roles.GetKubernetesWorker() == nil || n.Roles.GetConsensusMember() != nil {
		t.Fatalf("roles after UpdateNodeRoles: %v", n.Roles)
	}
	resp, err := bc.IssueCertificate(ctx, req)
	mustOK(t, "IssueCertificate", err)
	w := resp.GetKubernetesWorker()
	k8sCA, err := x509.ParseCertificate(w.GetIdentityCaCertificate())
	mustOK(t, "Kubernetes CA", err)
	if k8sCA.Equal(f.ca) {
		t.Error("the Kubernetes CA is the cluster CA")
	}
	cc, err := x509.ParseCertificate(w.KubeletClientCertificate)
	mustOK(t, "client certificate", err)
	if err := pki.Verify(k8sCA, nil, cc, pki.UsageClient); err != nil || cc.Subject.CommonName != "system:node:"+b.id ||
		len(cc.Subject.Organization) != 1 || cc.Subject.Organization[0] != "system:nodes" || !ed25519.PublicKey(clientPub).Equal(cc.PublicKey) {
		t.Errorf("kubelet client certificate: %v, %v", err, cc.Subject)
	}
	sc, err := x509.ParseCertificate(w.KubeletServerCertificate)
	mustOK(t, "server certificate", err)
	servingCA, err := x509.ParseCertificate(w.GetKubeletServingCaCertificate())
	mustOK(t, "kubelet serving CA", err)
	if err := pki.Verify(servingCA, nil, sc, pki.UsageServer); err != nil || sc.VerifyHostname(b.id) != nil ||
		sc.VerifyHostname(observedAt(b.id)[0].String()) != nil || sc.VerifyHostname("127.0.0.1") == nil {
		t.Errorf("kubelet server certificate: %v, %v %v (want the node's ID and observed address, never loopback)", err, sc.DNSNames, sc.IPAddresses)
	}
	// The same CA the second time.
	resp2, err := bc.IssueCertificate(ctx, req)
	mustOK(t, "IssueCertificate again", err)
	if !bytes.Equal(resp2.GetKubernetesWorker().IdentityCaCertificate, k8sCA.Raw) {
		t.Error("second IssueCertificate used another CA")
	}
}
