package curator

import (
	"crypto/ecdsa"
	"crypto/ed25519"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"net"
	"slices"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/protobuf/proto"

	"plinth.dev/plinth/api/clusterpb"
	"plinth.dev/plinth/platform/pki"
)

// TestKubernetesCredentials: the kubelet's certificates name exactly the
// caller and the addresses on its record, only workers get them, and
// only the owner gets kubectl credentials.
func TestKubernetesCredentials(t *testing.T) {
	c := newCluster(t)
	a := c.members[0]
	b := c.newMember("b")
	c.addNode(a, b)
	ctx := ctxTimeout(t, 2*time.Minute)
	mg := c.mgmt(a)
	on := proto.Bool(true)

	bc := clusterpb.NewCuratorClient(withCreds(t, a.addr(), b.creds))
	reported := []string{"10.0.2.15", "fd00::15", "127.0.0.1"}
	mustOK(t, "UpdateNodeStatus", second(bc.UpdateNodeStatus(ctx, &clusterpb.UpdateNodeStatusRequest{
		NodeId: b.id, Status: &clusterpb.NodeStatus{Addresses: reported, Version: "test"}})))
	clientPub, _, _ := ed25519.GenerateKey(rand.Reader)
	serverPub, _, _ := ed25519.GenerateKey(rand.Reader)
	proxyPub, _, _ := ed25519.GenerateKey(rand.Reader)
	req := &clusterpb.IssueCertificateRequest{Kind: &clusterpb.IssueCertificateRequest_KubernetesWorker_{
		KubernetesWorker: &clusterpb.IssueCertificateRequest_KubernetesWorker{KubeletClientPublicKey: clientPub, KubeletServerPublicKey: serverPub, ProxyPublicKey: proxyPub}}}

	_, err := bc.IssueCertificate(ctx, req)
	wantCode(t, "IssueCertificate without the worker role", err, codes.PermissionDenied, "KubernetesWorker")

	mustOK(t, "UpdateNodeRoles worker", second(mg.UpdateNodeRoles(ctx, &clusterpb.UpdateNodeRolesRequest{
		Node: &clusterpb.UpdateNodeRolesRequest_Id{Id: b.id}, KubernetesWorker: on})))
	issue := func(what string) (ca, client, server *x509.Certificate) {
		t.Helper()
		resp, err := bc.IssueCertificate(ctx, req)
		mustOK(t, what, err)
		w := resp.GetKubernetesWorker()
		var certs []*x509.Certificate
		for _, der := range [][]byte{w.GetIdentityCaCertificate(), w.GetKubeletClientCertificate(), w.GetKubeletServerCertificate(), w.GetProxyCertificate()} {
			cert, err := x509.ParseCertificate(der)
			mustOK(t, what, err)
			certs = append(certs, cert)
		}
		// kube-proxy's: the user the default roles give node-proxier.
		if err := pki.Verify(certs[0], nil, certs[3], pki.UsageClient); err != nil || certs[3].Subject.CommonName != "system:kube-proxy" ||
			len(certs[3].Subject.Organization) != 0 || !proxyPub.Equal(certs[3].PublicKey) {
			t.Errorf("kube-proxy certificate: %v, %v", err, certs[3].Subject)
		}
		return certs[0], certs[1], certs[2]
	}
	k8sCA, client, server := issue("IssueCertificate")
	if err := pki.Verify(k8sCA, nil, client, pki.UsageClient); err != nil || client.Subject.CommonName != "system:node:"+b.id ||
		!slices.Equal(client.Subject.Organization, []string{"system:nodes"}) || !clientPub.Equal(client.PublicKey) {
		t.Errorf("kubelet client certificate: %v, %v", err, client.Subject)
	}
	if err := pki.Verify(k8sCA, nil, server, pki.UsageServer); err != nil || !serverPub.Equal(server.PublicKey) {
		t.Errorf("kubelet server certificate: %v", err)
	}
	// Exactly the caller's ID and the addresses it reported.
	if !slices.Equal(server.DNSNames, []string{b.id}) || !slices.Equal(ipStrings(server.IPAddresses), reported) {
		t.Errorf("kubelet serving SANs %q %q, want %q %q", server.DNSNames, ipStrings(server.IPAddresses), b.id, reported)
	}
	if server.VerifyHostname(a.id) == nil || server.VerifyHostname("10.0.2.16") == nil {
		t.Error("kubelet serving certificate valid for another node's ID or an address not reported")
	}
	// Addresses follow the record.
	mustOK(t, "UpdateNodeStatus", second(bc.UpdateNodeStatus(ctx, &clusterpb.UpdateNodeStatusRequest{
		NodeId: b.id, Status: &clusterpb.NodeStatus{Addresses: []string{"10.0.2.17"}, Version: "test"}})))
	ca2, _, server := issue("IssueCertificate after a new status")
	if !ca2.Equal(k8sCA) || !slices.Equal(ipStrings(server.IPAddresses), []string{"10.0.2.17"}) || !slices.Equal(server.DNSNames, []string{b.id}) {
		t.Errorf("after a new status: same CA %v, SANs %q %q", ca2.Equal(k8sCA), server.DNSNames, ipStrings(server.IPAddresses))
	}
	// A small-order key is refused.
	bad := proto.Clone(req).(*clusterpb.IssueCertificateRequest)
	bad.GetKubernetesWorker().KubeletServerPublicKey = append([]byte{1}, make([]byte, 31)...)
	_, err = bc.IssueCertificate(ctx, bad)
	wantCode(t, "IssueCertificate with a small-order key", err, codes.InvalidArgument, "kubelet_server_public_key")

	// The owner's kubectl credentials.
	ownerKey, _ := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	der, _ := x509.MarshalPKIXPublicKey(ownerKey.Public())
	resp, err := mg.IssueKubernetesCredentials(ctx, &clusterpb.IssueKubernetesCredentialsRequest{PublicKey: der})
	mustOK(t, "IssueKubernetesCredentials", err)
	ca, err := x509.ParseCertificate(resp.CaCertificate)
	mustOK(t, "CA", err)
	cert, err := x509.ParseCertificate(resp.ClientCertificate)
	mustOK(t, "certificate", err)
	if !ca.Equal(k8sCA) {
		t.Error("the owner's certificate is from another CA than the kubelet's")
	}
	if err := pki.Verify(ca, nil, cert, pki.UsageClient); err != nil || !ownerKey.PublicKey.Equal(cert.PublicKey) ||
		cert.Subject.CommonName != "plinth-owner:owner" || !slices.Equal(cert.Subject.Organization, []string{"system:masters"}) {
		t.Errorf("owner certificate: %v, %v", err, cert.Subject)
	}
	if left := time.Until(cert.NotAfter); left > time.Hour || left < 59*time.Minute || resp.ExpiresUnixNanos != cert.NotAfter.UnixNano() {
		t.Errorf("owner certificate valid for another %v, expires_unix_nanos %d, NotAfter %v", left, resp.ExpiresUnixNanos, cert.NotAfter)
	}
	// The bootstrap node a is the only controller (b, a worker, is not).
	if !slices.Equal(resp.ApiServers, []string{"127.0.0.1:6443"}) {
		t.Errorf("API servers %q, want 127.0.0.1:6443", resp.ApiServers)
	}
	mustOK(t, "UpdateNodeRoles controller off", second(mg.UpdateNodeRoles(ctx, &clusterpb.UpdateNodeRolesRequest{
		Node: &clusterpb.UpdateNodeRolesRequest_Id{Id: a.id}, KubernetesController: proto.Bool(false)})))
	edPub, _, _ := ed25519.GenerateKey(rand.Reader)
	der, _ = x509.MarshalPKIXPublicKey(edPub)
	resp, err = mg.IssueKubernetesCredentials(ctx, &clusterpb.IssueKubernetesCredentialsRequest{PublicKey: der})
	mustOK(t, "IssueKubernetesCredentials with an ed25519 key", err)
	if len(resp.ApiServers) != 0 || len(resp.ClientCertificate) == 0 {
		t.Errorf("API servers %q without any controller", resp.ApiServers)
	}
	for name, key := range map[string][]byte{"garbage": []byte("not a key"), "raw ed25519": edPub, "none": nil} {
		_, err = mg.IssueKubernetesCredentials(ctx, &clusterpb.IssueKubernetesCredentialsRequest{PublicKey: key})
		wantCode(t, "IssueKubernetesCredentials with "+name, err, codes.InvalidArgument, "public_key")
	}

	// Not for nodes, whatever their roles.
	_, err = clusterpb.NewManagementClient(withCreds(t, a.addr(), b.creds)).IssueKubernetesCredentials(ctx,
		&clusterpb.IssueKubernetesCredentialsRequest{PublicKey: der})
	wantCode(t, "IssueKubernetesCredentials by a node", err, codes.PermissionDenied, "KUBERNETES_ADMIN")
}

func ipStrings(ips []net.IP) []string {
	var out []string
	for _, ip := range ips {
		out = append(out, ip.String())
	}
	return out
}
