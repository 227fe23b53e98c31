package kubernetes

import (
	"bytes"
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/json"
	"encoding/pem"
	"errors"
	"fmt"
	"io"
	"math/big"
	"net"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"plinth.dev/plinth/platform/layout"
	"plinth.dev/plinth/platform/supervisor"
	"plinth.dev/plinth/roleserver/kubernetes/pki"
)

// A decommissioned node's Kubernetes identities are refused by the API
// servers within a minute, though their certificates live on (the API
// server checks no CRL):
//
//	--authorization-config=authorization.json (reloaded on change)
//	  Webhook plinth-decommissioned   only while a node is decommissioned, and
//	    https://127.0.0.1:10252        only for its users (matchConditions list
//	    (this controller, authzWebhook) them): system:node:<id>,
//	                                   plinth:node-proxies:<id>,
//	                                   plinth:local-volumes:<id>
//	    ─► denied (failurePolicy Deny: also when it cannot answer)
//	    (the set unread, or too long a list: every node user is asked,
//	    failurePolicy NoOpinion; authorizationConfig)
//	  Node, RBAC                     as before
//	authzWebhook reads the decommissioned nodes every decommissionCheck
//	and rewrites authorization.json when they change.
//
// Why an authorizer and not a shorter certificate life: a worker's
// certificates last KubeletValidity so that a node cut off from the
// curator keeps running its pods; a decommission is the owner saying the
// node is gone, and every API server applies it at once.
//
// Why the retired users are listed in the configuration rather than
// every node user asked about: a webhook call is a round trip to
// another process on every request of every kubelet. Under load it
// was most of a kubelet request's time (a status patch's included),
// and a timed-out call let the request through anyway. Now the API
// server decides for serving nodes in process, and the webhook only
// answers for nodes already retired. Guarded by TestControlPlaneOnHost
// (checkDecommissionedIdentities).

// Files of the authorization configuration, in the API server's
// directory.
const (
	fileAuthorization      = "authorization.json"
	fileAuthzWebhookConfig = "authz-webhook.kubeconfig"
)

// decommissionCheck is how often the webhook reads which nodes are
// decommissioned; authzDeniedTTL how long an API server keeps a denial.
const (
	decommissionCheck = 15 * time.Second
	authzDeniedTTL    = 10 * time.Second
)

// nodeUserPrefixes are the prefixes of the users named after a node:
// its kubelet, its service components, its local volume provisioner.
var nodeUserPrefixes = []string{"system:node:", pki.ProxyPrefix, pki.LocalVolumesPrefix}

// maxListedUsers bounds the matchCondition that lists decommissioned
// nodes' users (CEL refuses expressions over 100,000 characters, and an
// API server whose configuration does not compile does not start):
// beyond it, about 350 nodes, every node user is asked about again.
const maxListedUsers = 64 << 10

// authorizationConfig is the API server's authorization configuration
// for the decommissioned nodes ids (known: read from the curator's
// store), then Node and RBAC:
//
//	known, none decommissioned   no webhook
//	known, listed fits           webhook for their users alone, failurePolicy Deny
//	unknown, or too many         webhook for every node user, failurePolicy
//	                             NoOpinion (it decides by what it last read)
//
// The same set gives the same bytes (the API server reloads on a change
// of them).
func authorizationConfig(dir string, ids []string, known bool) []byte {
	var match, failure string
	if users := decommissionedUsers(ids); known && len(users) > 0 {
		quoted := make([]string, len(users))
		for i, u := range users {
			quoted[i] = strconv.Quote(u)
		}
		match, failure = "request.user in ["+strings.Join(quoted, ", ")+"]", "Deny"
	}
	if !known || len(match) > maxListedUsers {
		var prefixes []string
		for _, p := range nodeUserPrefixes {
			prefixes = append(prefixes, "request.user.startsWith('"+p+"')")
		}
		match, failure = strings.Join(prefixes, " || "), "NoOpinion"
	}
	var authorizers []any
	if match != "" {
		authorizers = append(authorizers, map[string]any{"type": "Webhook", "name": "plinth-decommissioned", "webhook": map[string]any{
			"timeout":                    "3s",
			"subjectAccessReviewVersion": "v1",
			"matchConditionSubjectAccessReviewVersion": "v1",
			"failurePolicy":   failure,
			"authorizedTTL":   "1s",
			"unauthorizedTTL": authzDeniedTTL.String(),
			"connectionInfo":  map[string]any{"type": "KubeConfigFile", "kubeConfigFile": dir + "/" + fileAuthzWebhookConfig},
			"matchConditions": []any{map[string]string{"expression": match}},
		}})
	}
	authorizers = append(authorizers,
		map[string]any{"type": "Node", "name": "node"},
		map[string]any{"type": "RBAC", "name": "rbac"})
	return mustJSON(map[string]any{
		"apiVersion":  "apiserver.config.k8s.io/v1",
		"kind":        "AuthorizationConfiguration",
		"authorizers": authorizers,
	})
}

// decommissionedUsers are the users of the nodes ids, sorted.
func decommissionedUsers(ids []string) []string {
	var users []string
	for _, id := range ids {
		for _, p := range nodeUserPrefixes {
			users = append(users, p+id)
		}
	}
	slices.Sort(users)
	return slices.Compact(users)
}

// authorizationFiles are the API server's authorization configuration
// config (authorizationConfig) and the webhook's connection (its
// certificate caPEM).
func authorizationFiles(dir string, caPEM, config []byte) files {
	return files{
		fileAuthorization: config,
		fileAuthzWebhookConfig: mustJSON(map[string]any{
			"apiVersion": "v1", "kind": "Config",
			"clusters": []any{map[string]any{"name": "webhook", "cluster": map[string]any{
				"server":                     "https://127.0.0.1:" + strconv.Itoa(layout.KubernetesAuthzWebhookPort) + "/authorize",
				"certificate-authority-data": caPEM,
			}}},
			"users":           []any{map[string]any{"name": "apiserver", "user": map[string]any{}}},
			"contexts":        []any{map[string]any{"name": "webhook", "context": map[string]string{"cluster": "webhook", "user": "apiserver"}}},
			"current-context": "webhook",
		}),
	}
}

// webhookCertificate is a self-signed serving certificate for
// 127.0.0.1, made for one run of the control plane (it never leaves
// memory but for the API server's trust in it).
func webhookCertificate() (tls.Certificate, []byte, error) {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return tls.Certificate{}, nil, err
	}
	serial, err := rand.Int(rand.Reader, new(big.Int).Lsh(big.NewInt(1), 126))
	if err != nil {
		return tls.Certificate{}, nil, err
	}
	tmpl := &x509.Certificate{
		SerialNumber: serial, Subject: pkix.Name{CommonName: "plinth-authz-webhook"},
		NotBefore: time.Now().Add(-time.Minute), NotAfter: time.Now().Add(10 * 365 * 24 * time.Hour),
		IPAddresses: []net.IP{net.IPv4(127, 0, 0, 1)}, KeyUsage: x509.KeyUsageDigitalSignature | x509.KeyUsageCertSign,
		ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth}, BasicConstraintsValid: true, IsCA: true,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		return tls.Certificate{}, nil, err
	}
	return tls.Certificate{Certificate: [][]byte{der}, PrivateKey: key}, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}), nil
}

// decommissionedSet is the nodes decommissioned as last read.
type decommissionedSet struct {
	mu  sync.Mutex
	ids []string
}

func (d *decommissionedSet) set(ids []string) {
	d.mu.Lock()
	defer d.mu.Unlock()
	d.ids = ids
}

// node is the node user names, if it is one of a decommissioned node's.
func (d *decommissionedSet) node(user string) (string, bool) {
	d.mu.Lock()
	defer d.mu.Unlock()
	for _, p := range nodeUserPrefixes {
		if id, ok := strings.CutPrefix(user, p); ok && slices.Contains(d.ids, id) {
			return id, true
		}
	}
	return "", false
}

// subjectAccessReview is what the webhook reads of and answers to a
// SubjectAccessReview (authorization.k8s.io/v1).
type subjectAccessReview struct {
	APIVersion string `json:"apiVersion"`
	Kind       string `json:"kind"`
	Spec       struct {
		User string `json:"user"`
	} `json:"spec"`
	Status struct {
		Allowed bool   `json:"allowed"`
		Denied  bool   `json:"denied,omitempty"`
		Reason  string `json:"reason,omitempty"`
	} `json:"status"`
}

// ServeHTTP answers a SubjectAccessReview: denied for a decommissioned
// node's user, no opinion (not allowed, not denied) for any other.
func (d *decommissionedSet) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	var sar subjectAccessReview
	if err := json.NewDecoder(io.LimitReader(r.Body, 1<<20)).Decode(&sar); err != nil {
		http.Error(w, "not a SubjectAccessReview: "+err.Error(), http.StatusBadRequest)
		return
	}
	if id, ok := d.node(sar.Spec.User); ok {
		sar.Status.Denied = true
		sar.Status.Reason = "node " + id + " is decommissioned"
	}
	w.Header().Set("Content-Type", "application/json")
	json.NewEncoder(w).Encode(sar)
}

// authzWebhook is the runnable serving the webhook with cert, reading
// the decommissioned nodes with decommissioned every interval. started
// are the nodes the API server's configuration started with and config
// that configuration; render makes the configuration of a set read, and
// write hands a changed one to the API server. Writes that keep failing
// end the runnable (its restart is counted and backs off).
func authzWebhook(cert tls.Certificate, decommissioned func(context.Context) ([]string, error), interval time.Duration,
	started []string, config []byte, render func([]string) []byte, write func([]byte) error) supervisor.Runnable {
	const maxWriteFailures = 4
	return func(ctx context.Context) error {
		lis, err := net.Listen("tcp", "127.0.0.1:"+strconv.Itoa(layout.KubernetesAuthzWebhookPort))
		if err != nil {
			return fmt.Errorf("authorization webhook: %w", err)
		}
		set := &decommissionedSet{}
		set.set(started)
		srv := &http.Server{Handler: set, ReadHeaderTimeout: 10 * time.Second,
			TLSConfig: &tls.Config{Certificates: []tls.Certificate{cert}, MinVersion: tls.VersionTLS13}}
		errc := make(chan error, 1)
		go func() { errc <- srv.ServeTLS(lis, "", "") }()
		defer srv.Close()
		supervisor.Signal(ctx, supervisor.SignalHealthy)
		log := supervisor.Logger(ctx)
		written, failures := config, 0
		for {
			if decommissioned != nil {
				if ids, err := decommissioned(ctx); err != nil {
					log.Warn("reading the decommissioned nodes (tried again later)", "err", err)
				} else {
					set.set(ids)
					if next := render(ids); !bytes.Equal(next, written) {
						if err := write(next); err != nil {
							if failures++; failures >= maxWriteFailures {
								return fmt.Errorf("writing the authorization configuration: %w", err)
							}
							log.Warn("writing the authorization configuration (tried again later)", "err", err)
						} else {
							written, failures = next, 0
							log.Info("authorization configuration: decommissioned nodes refused", "nodes", ids)
						}
					}
				}
			}
			select {
			case <-ctx.Done():
				return ctx.Err()
			case err := <-errc:
				if errors.Is(err, http.ErrServerClosed) {
					return ctx.Err()
				}
				return fmt.Errorf("authorization webhook: %w", err)
			case <-time.After(interval):
			}
		}
	}
}
