package launch

import (
	"bytes"
	"crypto/ed25519"
	"crypto/rand"
	"crypto/subtle"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"log"
	"net"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"strings"
	"sync/atomic"
	"time"

	"github.com/google/go-containerregistry/pkg/registry"
	v1 "github.com/google/go-containerregistry/pkg/v1"

	"plinth.dev/plinth/platform/pki"
)

// Registry is a real OCI registry (go-containerregistry's pkg/registry,
// which follows the distribution spec) in the test process, for nodes to
// pull from:
//
//	node ──► 10.42.0.5:5000 ─┐ router (slirp guestfwd)   ┌► 127.0.0.1:A  anonymous
//	node ──► 10.42.0.6:5001 ─┼───────────────────────────┼► 127.0.0.1:B  HTTP basic auth
//	node ──► 10.42.0.7:5002 ─┘                           └► 127.0.0.1:B
//
// (QEMU names a guest forward's device by its guest port, so each has a
// port of its own.)
//
// Both listeners serve one in-memory store over TLS with a certificate
// from the registry's own CA for every guest address (nodes trust the CA
// only through the cluster policy's image registries). ClusterOptions.
// Registry puts the guest addresses on the cluster's switch.
type Registry struct {
	// CAPEM is the CA the registry's certificate chains to.
	CAPEM []byte
	// Anonymous and Auth are the listeners (127.0.0.1:port); Auth
	// answers 401 without Username and Password.
	Anonymous, Auth    string
	Username, Password string

	guests  []netip.Addr // one per guest forward: anonymous, auth, auth
	proxy   func(addr string) string
	servers []*http.Server
	store   http.Handler
	reqLog  atomic.Pointer[log.Logger] // LogRequests
}

// registryGuests are the registry's addresses on a switch network: after
// the network-boot server's (.4).
func registryGuests(subnet netip.Prefix) []netip.Addr {
	a := subnet.Masked().Addr()
	for range 5 {
		a = a.Next()
	}
	return []netip.Addr{a, a.Next(), a.Next().Next()}
}

// StartRegistry starts the registry for a cluster on subnet. proxy is
// the command (GuestForward.Cmd) that joins one guest connection to a
// listener's address: a registry client opens several connections.
func StartRegistry(subnet netip.Prefix, proxy func(addr string) string) (*Registry, error) {
	r := &Registry{Username: "puller", Password: "pull-" + rand.Text()[:12], guests: registryGuests(subnet), proxy: proxy}
	ca, err := pki.NewCA("Plinth harness registry CA", 24*time.Hour)
	if err != nil {
		return nil, err
	}
	r.CAPEM = pki.CertificatePEM(ca.Certificate)
	pub, key, err := ed25519.GenerateKey(rand.Reader)
	if err != nil {
		return nil, err
	}
	ips := []net.IP{net.IPv4(127, 0, 0, 1)}
	for _, g := range r.guests {
		ips = append(ips, g.AsSlice())
	}
	leaf, err := ca.Issue(pki.Template{CommonName: "registry", IPAddresses: ips, PublicKey: pub, Usage: pki.UsageServer, Validity: 24 * time.Hour})
	if err != nil {
		return nil, err
	}
	cert := tls.Certificate{Certificate: [][]byte{leaf.Raw}, PrivateKey: key}
	store := registry.New(registry.Logger(log.New(io.Discard, "", 0)))
	r.store = store
	for _, h := range []struct {
		addr *string
		h    http.Handler
	}{{&r.Anonymous, r.logged(store)}, {&r.Auth, r.logged(r.basicAuth(store))}} {
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			r.Close()
			return nil, err
		}
		*h.addr = l.Addr().String()
		srv := &http.Server{Handler: h.h, TLSConfig: &tls.Config{Certificates: []tls.Certificate{cert}, MinVersion: tls.VersionTLS12},
			ReadHeaderTimeout: time.Minute}
		r.servers = append(r.servers, srv)
		go srv.ServeTLS(l, "", "")
	}
	return r, nil
}

// LogRequests writes a line to w for every request the registry
// answers on its listeners, once answered: when it came, the method and
// path, the status, the bytes sent and how long sending took (a blob's
// time is the time the puller took to take it in, less what the
// sockets between buffer): where a slow pull spends its time.
func (r *Registry) LogRequests(w io.Writer) {
	r.reqLog.Store(log.New(w, "", 0))
}

func (r *Registry) logged(h http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, req *http.Request) {
		l := r.reqLog.Load()
		if l == nil {
			h.ServeHTTP(w, req)
			return
		}
		start := time.Now()
		cw := &countingWriter{ResponseWriter: w, status: http.StatusOK}
		h.ServeHTTP(cw, req)
		l.Printf("%s %s %s %d %d bytes in %v", start.Format("15:04:05.000"), req.Method, req.URL.Path, cw.status, cw.n,
			time.Since(start).Round(time.Millisecond))
	})
}

// countingWriter counts what a handler writes, and its status.
type countingWriter struct {
	http.ResponseWriter
	status int
	n      int64
}

func (c *countingWriter) WriteHeader(status int) {
	c.status = status
	c.ResponseWriter.WriteHeader(status)
}

func (c *countingWriter) Write(b []byte) (int, error) {
	n, err := c.ResponseWriter.Write(b)
	c.n += int64(n)
	return n, err
}

// basicAuth refuses requests without the registry's credentials the way
// a registry does: 401 with a Basic challenge.
func (r *Registry) basicAuth(h http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, req *http.Request) {
		u, p, ok := req.BasicAuth()
		if !ok || subtle.ConstantTimeCompare([]byte(u), []byte(r.Username)) != 1 || subtle.ConstantTimeCompare([]byte(p), []byte(r.Password)) != 1 {
			w.Header().Set("WWW-Authenticate", `Basic realm="plinth harness registry"`)
			http.Error(w, `{"errors":[{"code":"UNAUTHORIZED","message":"authentication required"}]}`, http.StatusUnauthorized)
			return
		}
		h.ServeHTTP(w, req)
	})
}

// registryGuestPort is the first guest forward's port; the others
// follow.
const registryGuestPort = 5000

// forwards are the router's guest forwards to the registry.
func (r *Registry) forwards() []GuestForward {
	hosts := []string{r.Anonymous, r.Auth, r.Auth}
	f := make([]GuestForward, len(hosts))
	for i, h := range hosts {
		f[i] = GuestForward{Guest: netip.AddrPortFrom(r.guests[i], uint16(registryGuestPort+i)), Host: h, Cmd: r.proxy(h)}
	}
	return f
}

// MirrorHost, AuthHost and OtherAuthHost are the registry as nodes reach
// it (image references' host part, address:port): anonymous, and twice
// with basic auth (the cluster policy can give the two different
// credentials).
func (r *Registry) MirrorHost() string    { return r.forwards()[0].Guest.String() }
func (r *Registry) AuthHost() string      { return r.forwards()[1].Guest.String() }
func (r *Registry) OtherAuthHost() string { return r.forwards()[2].Guest.String() }

// Push stores img as repo:tag, straight into the store (the registry
// API's monolithic blob uploads and a manifest PUT, served in the
// process), and returns its digest.
func (r *Registry) Push(repo, tag string, img v1.Image) (v1.Hash, error) {
	layers, err := img.Layers()
	if err != nil {
		return v1.Hash{}, err
	}
	cfgName, err := img.ConfigName()
	if err != nil {
		return v1.Hash{}, err
	}
	cfg, err := img.RawConfigFile()
	if err != nil {
		return v1.Hash{}, err
	}
	if err := r.putBlob(repo, cfgName, cfg); err != nil {
		return v1.Hash{}, err
	}
	for _, l := range layers {
		d, err := l.Digest()
		if err != nil {
			return v1.Hash{}, err
		}
		rc, err := l.Compressed()
		if err != nil {
			return v1.Hash{}, err
		}
		b, err := io.ReadAll(rc)
		rc.Close()
		if err != nil {
			return v1.Hash{}, err
		}
		if err := r.putBlob(repo, d, b); err != nil {
			return v1.Hash{}, err
		}
	}
	manifest, err := img.RawManifest()
	if err != nil {
		return v1.Hash{}, err
	}
	mt, err := img.MediaType()
	if err != nil {
		return v1.Hash{}, err
	}
	req := httptest.NewRequest(http.MethodPut, "/v2/"+repo+"/manifests/"+tag, bytes.NewReader(manifest))
	req.Header.Set("Content-Type", string(mt))
	if err := r.serve(req, http.StatusCreated); err != nil {
		return v1.Hash{}, fmt.Errorf("launch: registry: manifest %s:%s: %w", repo, tag, err)
	}
	return img.Digest()
}

// putBlob uploads one blob in one request.
func (r *Registry) putBlob(repo string, d v1.Hash, b []byte) error {
	req := httptest.NewRequest(http.MethodPost, "/v2/"+repo+"/blobs/uploads/?digest="+d.String(), bytes.NewReader(b))
	if err := r.serve(req, http.StatusCreated); err != nil {
		return fmt.Errorf("launch: registry: blob %s: %w", d, err)
	}
	return nil
}

// serve runs req against the store and wants status.
func (r *Registry) serve(req *http.Request, status int) error {
	rec := httptest.NewRecorder()
	r.store.ServeHTTP(rec, req)
	if rec.Code != status {
		return fmt.Errorf("%s %s: %d %s", req.Method, req.URL.Path, rec.Code, strings.TrimSpace(rec.Body.String()))
	}
	return nil
}

// Close stops the listeners.
func (r *Registry) Close() error {
	var errs []error
	for _, s := range r.servers {
		errs = append(errs, s.Close())
	}
	return errors.Join(errs...)
}
