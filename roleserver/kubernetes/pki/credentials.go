package pki

import (
	"context"
	"crypto"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/hex"
	"fmt"
	"math/big"
	"net"
	"slices"
	"strings"
	"time"
	"unicode"

	"plinth.dev/plinth/platform/layout"
	clusterpki "plinth.dev/plinth/platform/pki"
)

// Subjects Kubernetes gives meaning to.
const (
	groupMasters = "system:masters" // bypasses authorization
	groupNodes   = "system:nodes"

	// KubeletClientUser is the API server's user at the kubelets.
	KubeletClientUser     = "kube-apiserver-kubelet-client"
	nameFrontProxyClient  = "front-proxy-client"
	nameControllerManager = "system:kube-controller-manager"
	nameScheduler         = "system:kube-scheduler"
	nameAPIServer         = "kube-apiserver"
	nodeUserPrefix        = "system:node:"
	// OwnerPrefix starts the user name (CN) of the owner's certificates
	// (Owner).
	OwnerPrefix = "plinth-owner:"
	// ControllerPrefix starts the user name (CN) of the break-glass
	// certificates of Plinth's own steps (Admin): another prefix than
	// the owner's, so that the audit log never takes a controller's
	// request for the owner's, nor the other way round.
	ControllerPrefix = "plinth-controller:"
	// MetricsServerUser is the controllers' metrics servers' user at
	// the API servers and the kubelets (their resource metrics).
	MetricsServerUser = "plinth:metrics-server"
	// MetricsService is the Service (in kube-system) the API servers
	// reach the metrics servers through: the serving certificate's name.
	MetricsService = "metrics-server"
)

// KeyPair is a certificate and its private key, both PEM (the key
// PKCS#8), as Kubernetes components read them from files.
type KeyPair struct {
	Certificate []byte
	Key         []byte
}

// ControllerCredentials are what a controller node's kube-apiserver,
// kube-controller-manager and kube-scheduler need, with the flags they go
// to. Every key but the service-account key is fresh for each Controller
// call and stored nowhere else.
type ControllerCredentials struct {
	// CACertificate is the Kubernetes CA, PEM: --client-ca-file of the
	// API server, certificate-authority of the components' kubeconfigs,
	// --root-ca-file of the controller-manager.
	CACertificate []byte
	// FrontProxyCACertificate is the front-proxy CA, PEM:
	// --requestheader-client-ca-file.
	FrontProxyCACertificate []byte
	// KubeletServingCACertificate is the kubelet serving CA, PEM:
	// --kubelet-certificate-authority.
	KubeletServingCACertificate []byte
	// APIServer: --tls-cert-file / --tls-private-key-file.
	APIServer KeyPair
	// KubeletClient: --kubelet-client-certificate / --kubelet-client-key
	// (CN kube-apiserver-kubelet-client, bound to system:kubelet-api-admin).
	KubeletClient KeyPair
	// FrontProxyClient: --proxy-client-cert-file / --proxy-client-key-file
	// (CN front-proxy-client, from the front-proxy CA).
	FrontProxyClient KeyPair
	// ControllerManager and Scheduler are the client credentials of their
	// kubeconfigs (CN system:kube-controller-manager, system:kube-scheduler).
	ControllerManager KeyPair
	Scheduler         KeyPair
	// MetricsServer is the metrics server's client credential (CN
	// MetricsServerUser) and MetricsServing its serving certificate,
	// from the Kubernetes CA for the name the API servers' aggregator
	// checks (MetricsService.kube-system.svc).
	MetricsServer  KeyPair
	MetricsServing KeyPair
	// ServiceAccountPrivateKey (PKCS#8 PEM, ECDSA P-256) signs service
	// account tokens: --service-account-signing-key-file of the API
	// server, --service-account-private-key-file of the controller-manager.
	ServiceAccountPrivateKey []byte
	// ServiceAccountPublicKey (PKIX PEM) verifies them:
	// --service-account-key-file.
	ServiceAccountPublicKey []byte
	// NotAfter is when the first of these certificates expires: the
	// control plane must have new ones by then.
	NotAfter time.Time
}

// Controller issues the credentials of a controller node's control plane
// (see ControllerCredentials), creating the CAs and the service-account
// key on first use. addresses are the node's own; the API server's
// serving certificate is valid for them, the node ID, 127.0.0.1, the
// kubernetes Service's address and names.
func (p *PKI) Controller(ctx context.Context, nodeID string, addresses []net.IP) (*ControllerCredentials, error) {
	if err := checkNodeID(nodeID); err != nil {
		return nil, err
	}
	ips, err := checkAddresses(addresses)
	if err != nil {
		return nil, err
	}
	ca, err := p.authority(ctx, secretCA)
	if err != nil {
		return nil, err
	}
	frontProxy, err := p.authority(ctx, secretFrontProxyCA)
	if err != nil {
		return nil, err
	}
	kubeletServing, err := p.authority(ctx, secretKubeletServingCA)
	if err != nil {
		return nil, err
	}
	saPEM, saKey, err := p.serviceAccountKey(ctx)
	if err != nil {
		return nil, err
	}
	saPub, err := publicKeyPEM(saKey.Public())
	if err != nil {
		return nil, err
	}
	out := &ControllerCredentials{
		CACertificate:               clusterpki.CertificatePEM(ca.cert),
		FrontProxyCACertificate:     clusterpki.CertificatePEM(frontProxy.cert),
		KubeletServingCACertificate: clusterpki.CertificatePEM(kubeletServing.cert),
		ServiceAccountPrivateKey:    saPEM,
		ServiceAccountPublicKey:     saPub,
	}
	for _, s := range []struct {
		into *KeyPair
		ca   *authority
		tmpl *x509.Certificate
	}{
		{&out.APIServer, ca, apiServerTemplate(nodeID, ips)},
		// Bound to system:kubelet-api-admin (the RBAC objects the
		// controller applies): what the API server does on kubelets.
		{&out.KubeletClient, ca, clientTemplate(KubeletClientUser)},
		{&out.FrontProxyClient, frontProxy, clientTemplate(nameFrontProxyClient)},
		{&out.ControllerManager, ca, clientTemplate(nameControllerManager)},
		{&out.Scheduler, ca, clientTemplate(nameScheduler)},
		{&out.MetricsServer, ca, clientTemplate(MetricsServerUser)},
		{&out.MetricsServing, ca, &x509.Certificate{
			Subject:     pkix.Name{CommonName: MetricsService},
			DNSNames:    []string{MetricsService + ".kube-system.svc"},
			ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
		}},
	} {
		cert, kp, err := generateKeyPair(s.ca, s.tmpl)
		if err != nil {
			return nil, err
		}
		*s.into = kp
		if out.NotAfter.IsZero() || cert.NotAfter.Before(out.NotAfter) {
			out.NotAfter = cert.NotAfter
		}
	}
	return out, nil
}

// apiServerTemplate is the API server's serving certificate: reachable
// as the node, on loopback, and as the kubernetes Service from pods.
func apiServerTemplate(nodeID string, addresses []net.IP) *x509.Certificate {
	svc := "kubernetes.default.svc"
	return &x509.Certificate{
		Subject:     pkix.Name{CommonName: nameAPIServer},
		DNSNames:    []string{nodeID, "kubernetes", "kubernetes.default", svc, svc + "." + layout.ClusterDomain},
		IPAddresses: dedupIPs(slices.Concat(addresses, []net.IP{net.IPv4(127, 0, 0, 1), net.ParseIP(layout.KubernetesServiceIP)})),
		ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
	}
}

func clientTemplate(user string, groups ...string) *x509.Certificate {
	return &x509.Certificate{
		Subject:     pkix.Name{CommonName: user, Organization: groups},
		ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth},
	}
}

// generateKeyPair makes a fresh key and has ca certify it.
func generateKeyPair(ca *authority, tmpl *x509.Certificate) (*x509.Certificate, KeyPair, error) {
	key, err := newKey()
	if err != nil {
		return nil, KeyPair{}, err
	}
	cert, err := ca.issue(key.Public(), tmpl, ControllerValidity)
	if err != nil {
		return nil, KeyPair{}, err
	}
	keyPEM, err := privateKeyPEM(key)
	if err != nil {
		return nil, KeyPair{}, err
	}
	return cert, KeyPair{Certificate: clusterpki.CertificatePEM(cert), Key: keyPEM}, nil
}

// KubeletCertificates are a kubelet's certificates (Kubelet).
type KubeletCertificates struct {
	// CA is the Kubernetes CA: Client is from it, and the API servers'
	// certificates the kubelet checks.
	CA *x509.Certificate
	// ServingCA is the kubelet serving CA: Server is from it.
	ServingCA *x509.Certificate
	Client    *x509.Certificate
	Server    *x509.Certificate
}

// Kubelet certifies a kubelet's keys, which never leave its node: a
// client certificate for user system:node:<nodeID> in group system:nodes
// (what the Node authorizer and NodeRestriction expect) from the
// Kubernetes CA, and a serving certificate from the kubelet serving CA
// for exactly nodeID and those of addresses that can be a node's own,
// which the caller must know to be the node's (the curator uses the
// addresses it observed the node at, never a request's or the node's
// claim): loopback, unspecified and link-local addresses and the
// Service and pod ranges are left out, and none left is an error. Both
// keys must pass CheckPublicKey.
func (p *PKI) Kubelet(ctx context.Context, nodeID string, addresses []net.IP, clientPub, serverPub crypto.PublicKey) (*KubeletCertificates, error) {
	if err := checkNodeID(nodeID); err != nil {
		return nil, err
	}
	ips, err := checkAddresses(addresses)
	if err != nil {
		return nil, err
	}
	ips = slices.DeleteFunc(ips, notANodeAddress)
	if len(ips) == 0 {
		return nil, fmt.Errorf("%w: none of the addresses %v can be node %s's own", ErrInvalidArgument, addresses, nodeID)
	}
	for _, k := range []crypto.PublicKey{clientPub, serverPub} {
		if err := CheckPublicKey(k); err != nil {
			return nil, err
		}
	}
	a, err := p.authority(ctx, secretCA)
	if err != nil {
		return nil, err
	}
	serving, err := p.authority(ctx, secretKubeletServingCA)
	if err != nil {
		return nil, err
	}
	out := &KubeletCertificates{CA: a.cert, ServingCA: serving.cert}
	if out.Client, err = a.issue(clientPub, clientTemplate(nodeUserPrefix+nodeID, groupNodes), KubeletValidity); err != nil {
		return nil, err
	}
	out.Server, err = serving.issue(serverPub, &x509.Certificate{
		Subject:     pkix.Name{CommonName: nodeID},
		DNSNames:    []string{nodeID},
		IPAddresses: ips,
		ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
	}, KubeletValidity)
	if err != nil {
		return nil, err
	}
	return out, nil
}

// notANodeAddress reports whether ip cannot be where other nodes reach a
// kubelet: loopback, unspecified, link-local, or in the Service or pod
// ranges (a pod, or a Service VIP, must never pass for a kubelet).
func notANodeAddress(ip net.IP) bool {
	if ip.IsLoopback() || ip.IsUnspecified() || ip.IsLinkLocalUnicast() || ip.IsMulticast() {
		return true
	}
	for _, c := range []string{layout.ServiceCIDR, layout.ClusterCIDR} {
		if _, n, err := net.ParseCIDR(c); err == nil && n.Contains(ip) {
			return true
		}
	}
	return false
}

// ProxyGroup is the group of every worker's service components
// (kube-proxy, the pod network daemon, the DNS server), ProxyPrefix+<node
// ID> their user: Plinth's RBAC binds the group to system:node-proxier
// (read Services, EndpointSlices and Nodes) and what the DNS server and
// the network policy enforcer read besides. A user per node, so that a
// decommissioned node's is refused (authzwebhook.go). ProxyUser is the
// one user all workers' certificates named before: still bound, until
// the last such certificate (KubeletValidity) has expired.
const (
	ProxyGroup  = "plinth:node-proxies"
	ProxyPrefix = ProxyGroup + ":"
	ProxyUser   = "system:kube-proxy"
)

// Proxy certifies node's service components' key (see CheckPublicKey)
// as ProxyPrefix+nodeID in ProxyGroup, for KubeletValidity. It returns
// the certificate with the Kubernetes CA, created on first use.
func (p *PKI) Proxy(ctx context.Context, nodeID string, pub crypto.PublicKey) (ca, cert *x509.Certificate, err error) {
	return p.client(ctx, pub, ProxyPrefix+nodeID, KubeletValidity, ProxyGroup)
}

// LocalVolumesGroup is the group of every node's local volume
// provisioner, LocalVolumesPrefix+<node ID> its user: the RBAC Plinth
// applies lets the group create and delete PersistentVolumes, and the
// API server's local volume policy holds each user to its own node.
const (
	LocalVolumesGroup  = "plinth:local-volumes"
	LocalVolumesPrefix = LocalVolumesGroup + ":"
)

// LocalVolumes certifies a worker's local volume provisioner's key (see
// CheckPublicKey) as LocalVolumesPrefix+nodeID in LocalVolumesGroup, for
// KubeletValidity.
func (p *PKI) LocalVolumes(ctx context.Context, nodeID string, pub crypto.PublicKey) (ca, cert *x509.Certificate, err error) {
	return p.client(ctx, pub, LocalVolumesPrefix+nodeID, KubeletValidity, LocalVolumesGroup)
}

// client certifies pub (see CheckPublicKey) as user, in groups, for
// validity, with the Kubernetes CA (returned too).
func (p *PKI) client(ctx context.Context, pub crypto.PublicKey, user string, validity time.Duration, groups ...string) (ca, cert *x509.Certificate, err error) {
	if err := CheckPublicKey(pub); err != nil {
		return nil, nil, err
	}
	a, err := p.authority(ctx, secretCA)
	if err != nil {
		return nil, nil, err
	}
	if cert, err = a.issue(pub, clientTemplate(user, groups...), validity); err != nil {
		return nil, nil, err
	}
	return a.cert, cert, nil
}

// NodeIPAMUser is the controllers' node IPAM (pod CIDRs of Nodes): the
// RBAC Plinth applies lets it read Nodes and patch them, nothing else.
const NodeIPAMUser = "plinth:node-ipam"

// NodeIPAM certifies pub (see CheckPublicKey) as NodeIPAMUser for
// validity. It returns the certificate with the Kubernetes CA.
func (p *PKI) NodeIPAM(ctx context.Context, pub crypto.PublicKey, validity time.Duration) (ca, cert *x509.Certificate, err error) {
	return p.client(ctx, pub, NodeIPAMUser, validity)
}

// Admin certifies pub (see CheckPublicKey) as a Kubernetes superuser, the
// break-glass certificate of Plinth's own bootstrap steps (a controller
// applying its RBAC objects, name its node ID; the caller keeps it in
// memory only): user ControllerPrefix+name in group system:masters, for
// validity (at most MaxAdminValidity: Kubernetes cannot revoke it). It
// returns the certificate with the Kubernetes CA, created on first use.
func (p *PKI) Admin(ctx context.Context, pub crypto.PublicKey, name string, validity time.Duration) (ca, cert *x509.Certificate, err error) {
	if err := CheckPublicKey(pub); err != nil {
		return nil, nil, err
	}
	if validity <= 0 || validity > MaxAdminValidity {
		return nil, nil, fmt.Errorf("%w: validity %v is not in (0, %v]", ErrInvalidArgument, validity, MaxAdminValidity)
	}
	if name == "" || len(name) > 64 || strings.IndexFunc(name, func(r rune) bool { return r > unicode.MaxASCII || !unicode.IsPrint(r) || r == ' ' }) >= 0 {
		return nil, nil, fmt.Errorf("%w: user name %q (want 1 to 64 printable ASCII characters, no spaces)", ErrInvalidArgument, name)
	}
	a, err := p.authority(ctx, secretCA)
	if err != nil {
		return nil, nil, err
	}
	if cert, err = a.issue(pub, clientTemplate(ControllerPrefix+name, groupMasters), validity); err != nil {
		return nil, nil, err
	}
	return a.cert, cert, nil
}

// OwnerGroup is the group of the owner's certificates of epoch: the
// controllers bind cluster-admin to the current epoch's group alone.
func OwnerGroup(epoch uint64) string { return fmt.Sprintf("plinth:owner:%d", epoch) }

// Owner certifies pub (ECDSA P-256 or ed25519) for the owner's kubectl:
// user OwnerPrefix+<serial in hex> (each certificate its own name, so
// the audit log tells them apart) in group OwnerGroup(epoch), which is
// bound to cluster-admin while epoch is the cluster's (not
// system:masters: that group bypasses authorization and can never be
// revoked). It returns the certificate with the Kubernetes CA.
func (p *PKI) Owner(ctx context.Context, pub crypto.PublicKey, epoch uint64, validity time.Duration) (ca, cert *x509.Certificate, err error) {
	if err := CheckPublicKey(pub); err != nil {
		return nil, nil, err
	}
	if validity <= 0 || validity > MaxAdminValidity {
		return nil, nil, fmt.Errorf("%w: validity %v is not in (0, %v]", ErrInvalidArgument, validity, MaxAdminValidity)
	}
	a, err := p.authority(ctx, secretCA)
	if err != nil {
		return nil, nil, err
	}
	var serial [16]byte
	if _, err := rand.Read(serial[:]); err != nil {
		return nil, nil, err
	}
	serial[0] &= 0x7f // positive, and 16 bytes in the certificate
	serial[0] |= 0x40
	tmpl := clientTemplate(OwnerPrefix+hex.EncodeToString(serial[:]), OwnerGroup(epoch))
	tmpl.SerialNumber = new(big.Int).SetBytes(serial[:])
	if cert, err = a.issue(pub, tmpl, validity); err != nil {
		return nil, nil, err
	}
	return a.cert, cert, nil
}

// checkNodeID refuses what cannot be a node ID: it becomes a DNS name of
// serving certificates and part of a user name, so it must be one DNS
// label (node IDs are "plinth-" and 32 hex digits).
func checkNodeID(id string) error {
	ok := id != "" && len(id) <= 63 && id[0] != '-' && id[len(id)-1] != '-'
	for _, r := range id {
		ok = ok && (r >= 'a' && r <= 'z' || r >= '0' && r <= '9' || r == '-')
	}
	if !ok {
		return fmt.Errorf("%w: node ID %q is not a DNS label", ErrInvalidArgument, id)
	}
	return nil
}

// checkAddresses refuses anything but IPv4 and IPv6 addresses, and
// returns them without duplicates, in their order.
func checkAddresses(addresses []net.IP) ([]net.IP, error) {
	for _, ip := range addresses {
		if len(ip) != net.IPv4len && len(ip) != net.IPv6len {
			return nil, fmt.Errorf("%w: %q is not an IP address", ErrInvalidArgument, ip)
		}
	}
	return dedupIPs(addresses), nil
}

func dedupIPs(ips []net.IP) []net.IP {
	seen := map[string]bool{}
	var out []net.IP
	for _, ip := range ips {
		if s := ip.String(); !seen[s] {
			seen[s] = true
			if v4 := ip.To4(); v4 != nil {
				ip = v4
			}
			out = append(out, ip)
		}
	}
	return out
}
