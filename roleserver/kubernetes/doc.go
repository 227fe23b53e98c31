// Package kubernetes runs Kubernetes on a node as its roles say: the
// control plane (Controller) on a KubernetesController, which is always
// also a consensus member, and the worker (Worker) on a KubernetesWorker.
// Every piece is a supervised runnable; the programs are child processes
// of the core (the multi-call `kube` binary, containerd) with
// configuration generated in Go on tmpfs, never read from /data.
//
//	controller (root.roleserver.kubernetes.controller)
//	  etcd member (in the core) ── consensus.ServeKubernetes: only /kubernetes/,
//	        │                      a unix socket only the API server's UID, in the
//	        │                      core's cgroup, may use (etcd.sock)
//	  kube apiserver       uid 10001  :6443   admission (Pod Security, static policies:
//	        │                                 host paths, local volumes, external IPs, Pod
//	        │                                 Security labels), authorization (the
//	        │                                 decommissioned nodes' webhook, Node, RBAC),
//	        │                                 audit → /data by class (auditlog) and a log
//	        │                                 stream, Secrets encrypted
//	  authz-webhook        127.0.0.1:10252    decommissioned nodes' users denied (in the core)
//	  kube controller-manager uid 10002        pod CIDRs, the usual controllers
//	  kube scheduler       uid 10003
//	  kube metrics-server  uid 10004  :10251  metrics.k8s.io, aggregated (APIService, Service,
//	                                          this controller's EndpointSlice: metrics-api)
//	  rbac                 Plinth's roles, the owner's epoch binding, the default
//	                       StorageClass (in the core)
//	  volumes              decommissioned nodes' local volumes and metrics endpoints
//	                       deleted (in the core)
//
//	worker (root.roleserver.kubernetes.worker)
//	  apiproxy   127.0.0.1:6444 ──► every controller's :6443 (the cluster's list)
//	  containerd ── images (kube import-images: the node image's archives, once, pinned)
//	  kubelet    ── containerd; serving certificate from its own CA
//	  proxy      (kube-proxy, nftables)   netd (CNI config, routes)   dns (169.254.53.53)
//	  volumes    (kube local-volumes) claims' volumes on /data, each a filesystem of
//	             its own (platform/volumefs), mounted again before the kubelet starts
//	  netpol     (kube network-policies) NetworkPolicy for the node's pods, one nftables table
//
// Certificates. The controller's come from the Kubernetes PKI kept in
// etcd under the curator's namespace (package pki: a CA, the front proxy
// CA, the kubelet serving CA, the service-account key, the Secrets keys),
// which the API server's endpoint cannot read. A worker never sees a CA
// key: it makes its keys and asks the curator (IssueCertificate, over
// the node's mTLS connection) for the kubelet's client and serving and
// kube-proxy's certificates (a user per node, so that a decommissioned
// node's are refused); the serving certificate names only addresses
// the curator observed the node at. Owners reach the API server with
// short-lived certificates from the curator too (plinthctl cluster
// kubeconfig).
//
// Why in the core's tree, not as static pods: the control plane must
// start before any API server exists (there is nothing to read static
// pod manifests from but the node image), its keys must stay out of
// containers, and its restarts, crashes and logs are the node's own
// (plinthctl node status and node logs), like every other part of
// Plinth.
package kubernetes
