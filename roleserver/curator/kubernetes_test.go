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
	"plinth.dev/plinth/platform/releasekeys"
	kpki "plinth.dev/plinth/roleserver/kubernetes/pki"
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
	// b claims addresses; the curator sees it at others (and one that a
	// also claims to be seen at).
	reported := []string{"10.0.2.16", "fd00::16", "127.0.0.1"}
	observed := []string{"10.0.2.15", "fd00::15", "127.0.0.1", "10.0.2.99"}
	testObserved.Store(b.id, parseIPs(observed))
	testObserved.Store(a.id, parseIPs([]string{"10.0.2.99"}))
	mustOK(t, "UpdateNodeStatus", second(clusterpb.NewCuratorClient(withCreds(t, a.addr(), a.creds)).UpdateNodeStatus(ctx,
		&clusterpb.UpdateNodeStatusRequest{NodeId: a.id, Status: &clusterpb.NodeStatus{Addresses: []string{"127.0.0.1"}, Version: "test"}})))
	mustOK(t, "UpdateNodeStatus", second(bc.UpdateNodeStatus(ctx, &clusterpb.UpdateNodeStatusRequest{
		NodeId: b.id, Status: &clusterpb.NodeStatus{Addresses: reported, Version: "test"}})))
	clientPub, _, _ := ed25519.GenerateKey(rand.Reader)
	serverPub, _, _ := ed25519.GenerateKey(rand.Reader)
	proxyPub, _, _ := ed25519.GenerateKey(rand.Reader)
	volumesPub, _, _ := ed25519.GenerateKey(rand.Reader)
	req := &clusterpb.IssueCertificateRequest{Kind: &clusterpb.IssueCertificateRequest_KubernetesWorker_{
		KubernetesWorker: &clusterpb.IssueCertificateRequest_KubernetesWorker{KubeletClientPublicKey: clientPub, KubeletServerPublicKey: serverPub,
			ProxyPublicKey: proxyPub, LocalVolumesPublicKey: volumesPub}}}

	_, err := bc.IssueCertificate(ctx, req)
	wantCode(t, "IssueCertificate without the worker role", err, codes.PermissionDenied, "KubernetesWorker")

	mustOK(t, "UpdateNodeRoles worker", second(mg.UpdateNodeRoles(ctx, &clusterpb.UpdateNodeRolesRequest{
		Node: &clusterpb.UpdateNodeRolesRequest_Id{Id: b.id}, KubernetesWorker: on})))
	var servingCA *x509.Certificate
	issue := func(what string) (ca, client, server *x509.Certificate) {
		t.Helper()
		resp, err := bc.IssueCertificate(ctx, req)
		mustOK(t, what, err)
		w := resp.GetKubernetesWorker()
		var certs []*x509.Certificate
		for _, der := range [][]byte{w.GetIdentityCaCertificate(), w.GetKubeletClientCertificate(), w.GetKubeletServerCertificate(), w.GetProxyCertificate(),
			w.GetKubeletServingCaCertificate()} {
			cert, err := x509.ParseCertificate(der)
			mustOK(t, what, err)
			certs = append(certs, cert)
		}
		// kube-proxy's: its node's user, in the group Plinth's RBAC
		// binds to node-proxier.
		if err := pki.Verify(certs[0], nil, certs[3], pki.UsageClient); err != nil || certs[3].Subject.CommonName != kpki.ProxyPrefix+b.id ||
			!slices.Equal(certs[3].Subject.Organization, []string{kpki.ProxyGroup}) || !proxyPub.Equal(certs[3].PublicKey) {
			t.Errorf("kube-proxy certificate: %v, %v", err, certs[3].Subject)
		}
		// The local volume provisioner's: its node's user, in the group
		// the RBAC binds.
		volumes, err := x509.ParseCertificate(w.GetLocalVolumesCertificate())
		mustOK(t, what, err)
		if err := pki.Verify(certs[0], nil, volumes, pki.UsageClient); err != nil || volumes.Subject.CommonName != "plinth:local-volumes:"+b.id ||
			!slices.Equal(volumes.Subject.Organization, []string{"plinth:local-volumes"}) || !volumesPub.Equal(volumes.PublicKey) {
			t.Errorf("local volume provisioner certificate: %v, %v", err, volumes.Subject)
		}
		servingCA = certs[4]
		return certs[0], certs[1], certs[2]
	}
	k8sCA, client, server := issue("IssueCertificate")
	if err := pki.Verify(k8sCA, nil, client, pki.UsageClient); err != nil || client.Subject.CommonName != "system:node:"+b.id ||
		!slices.Equal(client.Subject.Organization, []string{"system:nodes"}) || !clientPub.Equal(client.PublicKey) {
		t.Errorf("kubelet client certificate: %v, %v", err, client.Subject)
	}
	// The serving certificate is from the kubelet serving CA, not the
	// Kubernetes CA (which signs the API servers').
	if err := pki.Verify(servingCA, nil, server, pki.UsageServer); err != nil || !serverPub.Equal(server.PublicKey) || servingCA.Equal(k8sCA) {
		t.Errorf("kubelet server certificate: %v", err)
	}
	if pki.Verify(k8sCA, nil, server, pki.UsageServer) == nil {
		t.Error("the kubelet's serving certificate verifies against the Kubernetes CA")
	}
	// Exactly the caller's ID and the addresses the curator saw it at,
	// less loopback and the one another node was seen at; nothing it
	// claimed.
	if want := []string{"10.0.2.15", "fd00::15"}; !slices.Equal(server.DNSNames, []string{b.id}) || !slices.Equal(ipStrings(server.IPAddresses), want) {
		t.Errorf("kubelet serving SANs %q %q, want %q %q", server.DNSNames, ipStrings(server.IPAddresses), b.id, want)
	}
	if server.VerifyHostname(a.id) == nil || server.VerifyHostname("10.0.2.16") == nil || server.VerifyHostname("10.0.2.99") == nil {
		t.Error("kubelet serving certificate valid for another node's ID, an address only claimed, or another node's address")
	}
	// Addresses follow what the curator sees.
	testObserved.Store(b.id, parseIPs([]string{"10.0.2.17"}))
	mustOK(t, "UpdateNodeStatus", second(bc.UpdateNodeStatus(ctx, &clusterpb.UpdateNodeStatusRequest{
		NodeId: b.id, Status: &clusterpb.NodeStatus{Addresses: []string{"10.0.2.18"}, Version: "test"}})))
	ca2, _, server := issue("IssueCertificate after a new status")
	if !ca2.Equal(k8sCA) || !slices.Equal(ipStrings(server.IPAddresses), []string{"10.0.2.17"}) || !slices.Equal(server.DNSNames, []string{b.id}) {
		t.Errorf("after a new status: same CA %v, SANs %q %q", ca2.Equal(k8sCA), server.DNSNames, ipStrings(server.IPAddresses))
	}
	// A small-order key is refused.
	bad := proto.Clone(req).(*clusterpb.IssueCertificateRequest)
	bad.GetKubernetesWorker().KubeletServerPublicKey = append([]byte{1}, make([]byte, 31)...)
	_, err = bc.IssueCertificate(ctx, bad)
	wantCode(t, "IssueCertificate with a small-order key", err, codes.InvalidArgument, "kubelet_server_public_key")
	bad = proto.Clone(req).(*clusterpb.IssueCertificateRequest)
	bad.GetKubernetesWorker().LocalVolumesPublicKey = []byte{1, 2, 3}
	_, err = bc.IssueCertificate(ctx, bad)
	wantCode(t, "IssueCertificate with a short provisioner key", err, codes.InvalidArgument, "local_volumes_public_key")
	// A node that sends no provisioner key (one from before) gets none.
	old := proto.Clone(req).(*clusterpb.IssueCertificateRequest)
	old.GetKubernetesWorker().LocalVolumesPublicKey = nil
	if resp, err := bc.IssueCertificate(ctx, old); err != nil || len(resp.GetKubernetesWorker().GetLocalVolumesCertificate()) != 0 {
		t.Errorf("IssueCertificate without a provisioner key: %v, %d bytes of provisioner certificate", err, len(resp.GetKubernetesWorker().GetLocalVolumesCertificate()))
	}

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
		cert.Subject.CommonName != "plinth-owner:"+cert.SerialNumber.Text(16) || !slices.Equal(cert.Subject.Organization, []string{"plinth:owner:0"}) {
		t.Errorf("owner certificate: %v, %v (want plinth-owner:<serial>, group plinth:owner:0, not system:masters)", err, cert.Subject)
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

func parseIPs(ss []string) []net.IP {
	var out []net.IP
	for _, s := range ss {
		out = append(out, net.ParseIP(s))
	}
	return out
}

func ipStrings(ips []net.IP) []string {
	var out []string
	for _, ip := range ips {
		out = append(out, ip.String())
	}
	return out
}

// TestClusterPolicy: the owner changes the Kubernetes policy and the
// release keys, each version signed by a key of the one before (a bad
// policy, or a key set that does not extend the chain as a node would
// verify it, is refused and changes nothing), and revoking the owner's Kubernetes credentials
// moves the epoch that the next certificate's group carries. Nodes may
// do none of it.
func TestClusterPolicy(t *testing.T) {
	c := newCluster(t)
	a := c.members[0]
	ctx := ctxTimeout(t, time.Minute)
	mg := c.mgmt(a)
	info := func() *clusterpb.ClusterConfiguration {
		t.Helper()
		r, err := mg.GetClusterInfo(ctx, &clusterpb.GetClusterInfoRequest{})
		mustOK(t, "GetClusterInfo", err)
		return r.GetConfiguration()
	}
	k1, k1priv, _ := ed25519.GenerateKey(rand.Reader)
	k2, k2priv, _ := ed25519.GenerateKey(rand.Reader)
	_, kx, _ := ed25519.GenerateKey(rand.Reader)
	keySet := func(prev *releasekeys.Signed, keys []ed25519.PublicKey, signers ...ed25519.PrivateKey) releasekeys.Signed {
		t.Helper()
		var raw [][]byte
		for _, k := range keys {
			raw = append(raw, k)
		}
		b, err := releasekeys.NextKeySet(prev, raw)
		if err != nil {
			t.Fatal(err)
		}
		return releasekeys.Sign(b, signers...)
	}
	// The first key of a cluster without one: signed by itself alone.
	genesis := keySet(nil, []ed25519.PublicKey{k1}, k1priv)
	r, err := mg.UpdateClusterPolicy(ctx, &clusterpb.UpdateClusterPolicyRequest{
		Kubernetes:  &clusterpb.KubernetesPolicy{PodSecurityLevel: "restricted", AllowedHostPaths: []string{"/data/volumes"}},
		ReleaseKeys: clusterpb.NewSignedStatement(genesis)})
	mustOK(t, "UpdateClusterPolicy", err)
	if got := info(); !proto.Equal(got, r.GetConfiguration()) || got.GetKubernetes().GetPodSecurityLevel() != "restricted" ||
		!slices.Equal(got.GetKubernetes().GetAllowedHostPaths(), []string{"/data/volumes"}) || len(got.GetReleaseKeys()) != 1 || len(got.GetReleaseKeyChain()) != 1 {
		t.Errorf("stored policy %v, answered %v", got, r.GetConfiguration())
	}
	before := info()
	for name, req := range map[string]*clusterpb.UpdateClusterPolicyRequest{
		"level":     {Kubernetes: &clusterpb.KubernetesPolicy{PodSecurityLevel: "lax"}},
		"host path": {Kubernetes: &clusterpb.KubernetesPolicy{AllowedHostPaths: []string{"/"}}},
	} {
		_, err := mg.UpdateClusterPolicy(ctx, req)
		wantCode(t, "UpdateClusterPolicy with a bad "+name, err, codes.InvalidArgument)
	}
	// With the owner's certificate alone: a second key no current key
	// signed, a second genesis, a statement that is none.
	for name, s := range map[string]releasekeys.Signed{
		"a key set signed by the new key alone": keySet(&genesis, []ed25519.PublicKey{k1, k2}, k2priv),
		"another first key set":                 keySet(nil, []ed25519.PublicKey{k2}, k2priv),
		"K1 replaced, signed by an outsider":    keySet(&genesis, []ed25519.PublicKey{kx.Public().(ed25519.PublicKey)}, kx),
		"garbage":                               releasekeys.Sign([]byte("{"), k1priv),
	} {
		_, err := mg.UpdateClusterPolicy(ctx, &clusterpb.UpdateClusterPolicyRequest{ReleaseKeys: clusterpb.NewSignedStatement(s)})
		wantCode(t, name, err, codes.FailedPrecondition, "release key")
	}
	if got := info(); !proto.Equal(got, before) {
		t.Errorf("refused updates changed the policy: %v, was %v", got, before)
	}
	// The owner's rotation: K2 added (signed by K1 and K2), K1 removed
	// (signed by K2).
	v2 := keySet(&genesis, []ed25519.PublicKey{k1, k2}, k1priv, k2priv)
	mustOK(t, "adding a release key", second(mg.UpdateClusterPolicy(ctx, &clusterpb.UpdateClusterPolicyRequest{ReleaseKeys: clusterpb.NewSignedStatement(v2)})))
	v3 := keySet(&v2, []ed25519.PublicKey{k2}, k2priv)
	mustOK(t, "removing one release key", second(mg.UpdateClusterPolicy(ctx, &clusterpb.UpdateClusterPolicyRequest{ReleaseKeys: clusterpb.NewSignedStatement(v3)})))
	if got := info(); len(got.GetReleaseKeys()) != 1 || !slices.Equal(got.GetReleaseKeys()[0], []byte(k2)) || len(got.GetReleaseKeyChain()) != 3 {
		t.Errorf("release keys after the rotation: %x (%d statements)", got.GetReleaseKeys(), len(got.GetReleaseKeyChain()))
	}

	rv, err := mg.RevokeKubernetesCredentials(ctx, &clusterpb.RevokeKubernetesCredentialsRequest{})
	mustOK(t, "RevokeKubernetesCredentials", err)
	if rv.GetEpoch() != 1 || info().GetKubernetesOwnerEpoch() != 1 {
		t.Errorf("epoch after a revocation: %d, stored %d", rv.GetEpoch(), info().GetKubernetesOwnerEpoch())
	}
	key, _ := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	der, _ := x509.MarshalPKIXPublicKey(key.Public())
	resp, err := mg.IssueKubernetesCredentials(ctx, &clusterpb.IssueKubernetesCredentialsRequest{PublicKey: der})
	mustOK(t, "IssueKubernetesCredentials", err)
	if cert, err := x509.ParseCertificate(resp.ClientCertificate); err != nil || !slices.Equal(cert.Subject.Organization, []string{"plinth:owner:1"}) {
		t.Errorf("the owner's certificate after a revocation: %v, %v", err, cert.Subject)
	}

	b := c.newMember("b")
	c.addNode(a, b)
	nodeMg := clusterpb.NewManagementClient(withCreds(t, a.addr(), b.creds))
	_, err = nodeMg.UpdateClusterPolicy(ctx, &clusterpb.UpdateClusterPolicyRequest{Kubernetes: &clusterpb.KubernetesPolicy{PodSecurityLevel: "privileged"}})
	wantCode(t, "UpdateClusterPolicy by a node", err, codes.PermissionDenied, "UPDATE_CLUSTER_POLICY")
	_, err = nodeMg.RevokeKubernetesCredentials(ctx, &clusterpb.RevokeKubernetesCredentialsRequest{})
	wantCode(t, "RevokeKubernetesCredentials by a node", err, codes.PermissionDenied, "KUBERNETES_ADMIN")
}

// TestObserveAddress: a node is seen at the source of its connection;
// over loopback only the curator's own node is, at its interfaces.
func TestObserveAddress(t *testing.T) {
	local := func() []net.IP { return parseIPs([]string{"10.0.2.15"}) }
	for _, c := range []struct {
		id, source string
		want       []string
	}{
		{"n2", "10.42.0.11", []string{"10.42.0.11"}},
		{"self", "127.0.0.1", []string{"10.0.2.15"}},
		{"n2", "127.0.0.1", nil},
		{"n2", "::1", nil},
		{"n2", "0.0.0.0", nil},
	} {
		if got := ipStrings(observeAddress("self", c.id, net.ParseIP(c.source), local)); !slices.Equal(got, c.want) {
			t.Errorf("node %s from %s: seen at %q, want %q", c.id, c.source, got, c.want)
		}
	}
}
