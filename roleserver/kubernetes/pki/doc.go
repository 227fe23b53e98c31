// Package pki is the Kubernetes PKI of a Plinth cluster: three CAs and the
// service-account signing key, kept in etcd in the curator's namespace,
// and the certificates Kubernetes components and users need, issued
// from them.
//
//	etcd, curator namespace
//	/kubernetes-ca/ca.pem, ca-key.pem                    Kubernetes CA
//	 │  (the API server's --client-ca-file; what kubelets and kubectl trust)
//	 ├── kube-apiserver              serving   SANs: node ID, node addresses, 127.0.0.1,
//	 │                                         10.96.0.1, kubernetes[.default[.svc[.cluster.local]]]
//	 ├── kube-apiserver-kubelet-client                        API server → kubelets
//	 │                                                        (bound to system:kubelet-api-admin)
//	 ├── system:kube-controller-manager                       controller-manager → API server
//	 ├── system:kube-scheduler                                scheduler → API server
//	 ├── system:node:<id>                O=system:nodes       kubelet → API server (curator
//	 │                                                        IssueCertificate)
//	 ├── plinth-owner:<serial>           O=plinth:owner:<epoch>  owner's kubectl (Management.
//	 │                                                        IssueKubernetesCredentials), 1 h
//	 └── plinth-controller:<node ID>     O=system:masters     break-glass: a controller applying
//	                                                          Plinth's RBAC objects, 10 min, memory only
//	/kubernetes-ca/kubelet-serving-ca.pem, kubelet-serving-ca-key.pem  kubelet serving CA
//	 │  (the API server's --kubelet-certificate-authority)
//	 └── <id>                    serving   SANs: node ID, the addresses the curator observed
//	/kubernetes-ca/front-proxy-ca.pem, front-proxy-ca-key.pem   front-proxy CA
//	 │  (--requestheader-client-ca-file)
//	 └── front-proxy-client                                   API server → aggregated API servers
//	/kubernetes-ca/service-account-key.pem                      service-account key (ECDSA P-256,
//	       PKCS#8): signs tokens (--service-account-signing-key-file), its public half verifies them
//
// Controller returns everything a controller node's kube-apiserver,
// kube-controller-manager and kube-scheduler need; Kubelet is what the
// curator's IssueCertificate signs for a worker's kubelet; Owner is the
// owner's short-lived kubectl certificate (revocable: its group names an
// epoch), Admin the break-glass system:masters certificate of Plinth's
// own steps, under a user name of its own (ControllerPrefix) so that the
// audit log tells the controller from the owner.
//
// Why a CA of its own, separate from the cluster CA: Kubernetes decides
// who a client is from its certificate's subject alone (CN = user, O =
// groups), so any certificate of the cluster CA would be a Kubernetes
// identity, and any Kubernetes certificate a cluster one. Why a CA of
// their own for the kubelets' serving certificates: the API server trusts
// a kubelet it reaches for whatever that CA signs, so it signs nothing
// else. Why another for the front proxy: the API server believes the user names in the
// request headers of any client certificate from the requestheader CA, so
// that CA must sign nothing but the front-proxy client (the Kubernetes
// documentation warns against reusing the client CA).
//
// What is stored: only the three CAs and the service-account key (and
// the Secrets encryption keys, secrets.go), created on first use, each
// in one create-if-absent transaction (of two concurrent creators, the
// first commit wins and the other reads it). The keys of the
// certificates are never stored: Controller generates fresh ones on the
// node at every call (the node is a consensus member and can read the
// CAs anyway), and Kubelet, Owner and Admin certify public keys whose
// private halves never leave their holders.
//
// Keys and lifetimes. Kubernetes checks no revocation lists, so expiry is
// the only way a certificate ends; lifetimes are as short as their
// renewal allows:
//
//   - CAs: ECDSA P-256, 10 years. A CA created by an older Plinth with an
//     ed25519 key is loaded and kept as it is.
//   - Controller certificates (ControllerValidity, 1 year): issued anew
//     at every start of the control plane.
//   - Kubelet certificates (KubeletValidity, 30 days): the worker asks
//     again before they expire. A decommissioned node keeps a kubelet
//     certificate until then.
//   - Admin certificates: the caller's validity, at most MaxAdminValidity.
//   - Component keys generated here are ECDSA P-256: kube-apiserver would
//     take ed25519 for TLS key pairs, but not for the service-account key
//     (keyutil and the token signer know only RSA and ECDSA), and P-256 is
//     what every client library verifies. Kubelet and Admin accept ECDSA
//     P-256 and ed25519 public keys (the kubelet's keys are ed25519).
//
// This package is linked into PID 1 and therefore uses no k8s.io package
// (a test checks).
package pki
