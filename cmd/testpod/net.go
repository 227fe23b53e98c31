package main

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"flag"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"os"
	"os/signal"
	"path/filepath"
	"strings"
	"time"

	"golang.org/x/sys/unix"
)

// What a pod sees of the cluster: the API server's Service name and the
// service account files the kubelet mounts into every pod.
const (
	apiServer      = "https://kubernetes.default.svc.cluster.local"
	serviceAccount = "/var/run/secrets/kubernetes.io/serviceaccount"
)

func newFlags(name string, stderr io.Writer) *flag.FlagSet {
	fs := flag.NewFlagSet("testpod "+name, flag.ContinueOnError)
	fs.SetOutput(stderr)
	return fs
}

// serveCmd answers HTTP until SIGTERM/SIGINT.
func serveCmd(args []string, stdout, stderr io.Writer) int {
	fs := newFlags("serve", stderr)
	port := fs.Int("port", 8080, "TCP port to listen on (all addresses)")
	if fs.Parse(args) != nil {
		return 2
	}
	ln, err := net.Listen("tcp", fmt.Sprintf(":%d", *port))
	if err != nil {
		fmt.Fprintln(stderr, "testpod serve:", err)
		return 1
	}
	srv := &http.Server{Handler: handler(), ReadHeaderTimeout: 10 * time.Second}
	ctx, stop := signal.NotifyContext(context.Background(), unix.SIGTERM, unix.SIGINT)
	defer stop()
	go func() {
		<-ctx.Done()
		sctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		srv.Shutdown(sctx)
	}()
	fmt.Fprintf(stdout, "testpod serve: listening on %s\n", ln.Addr())
	if err := srv.Serve(ln); err != nil && !errors.Is(err, http.ErrServerClosed) {
		fmt.Fprintln(stderr, "testpod serve:", err)
		return 1
	}
	return 0
}

func handler() http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("/healthz", func(w http.ResponseWriter, _ *http.Request) {
		io.WriteString(w, "ok\n")
	})
	mux.HandleFunc("/", func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path != "/" {
			http.NotFound(w, r)
			return
		}
		host, _ := os.Hostname()
		fmt.Fprintf(w, "hello from %s\n", host)
	})
	return mux
}

// dnsCmd resolves one name with the resolver a pod is given (its
// /etc/resolv.conf: the cluster DNS and search domains).
func dnsCmd(args []string, stdout, stderr io.Writer) int {
	fs := newFlags("dns", stderr)
	timeout := fs.Duration("timeout", 10*time.Second, "give up after")
	if fs.Parse(args) != nil || fs.NArg() != 1 {
		fmt.Fprintln(stderr, "usage: testpod dns [-timeout 10s] NAME")
		return 2
	}
	if err := resolve(fs.Arg(0), *timeout, stdout); err != nil {
		fmt.Fprintln(stderr, "testpod dns:", err)
		return 1
	}
	return 0
}

func resolve(name string, timeout time.Duration, stdout io.Writer) error {
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	addrs, err := net.DefaultResolver.LookupHost(ctx, name)
	if err != nil {
		return err
	}
	if len(addrs) == 0 {
		return fmt.Errorf("lookup %s: no addresses", name)
	}
	fmt.Fprintf(stdout, "%s: %s\n", name, strings.Join(addrs, " "))
	return nil
}

// apiCmd lists at most one pod of the pod's own namespace, which a
// service account may only do when the API server, its certificate, the
// token and RBAC all work.
func apiCmd(args []string, stdout, stderr io.Writer) int {
	fs := newFlags("api", stderr)
	server := fs.String("server", apiServer, "API server base URL")
	account := fs.String("account", serviceAccount, "directory with the service account's token, ca.crt and namespace")
	timeout := fs.Duration("timeout", 10*time.Second, "give up after")
	if fs.Parse(args) != nil || fs.NArg() != 0 {
		return 2
	}
	if err := callAPI(*server, *account, *timeout, stdout); err != nil {
		fmt.Fprintln(stderr, "testpod api:", err)
		return 1
	}
	return 0
}

func callAPI(server, account string, timeout time.Duration, stdout io.Writer) error {
	read := func(name string) (string, error) {
		b, err := os.ReadFile(filepath.Join(account, name))
		if err != nil {
			return "", fmt.Errorf("service account: %w", err)
		}
		return strings.TrimSpace(string(b)), nil
	}
	token, err := read("token")
	if err != nil {
		return err
	}
	ns, err := read("namespace")
	if err != nil {
		return err
	}
	caPEM, err := read("ca.crt")
	if err != nil {
		return err
	}
	pool := x509.NewCertPool()
	if !pool.AppendCertsFromPEM([]byte(caPEM)) {
		return fmt.Errorf("service account: no certificate in %s", filepath.Join(account, "ca.crt"))
	}
	client := &http.Client{
		Timeout:   timeout,
		Transport: &http.Transport{TLSClientConfig: &tls.Config{RootCAs: pool, MinVersion: tls.VersionTLS12}},
	}
	u := strings.TrimSuffix(server, "/") + "/api/v1/namespaces/" + url.PathEscape(ns) + "/pods?limit=1"
	req, err := http.NewRequest(http.MethodGet, u, nil)
	if err != nil {
		return err
	}
	req.Header.Set("Authorization", "Bearer "+token)
	req.Header.Set("Accept", "application/json")
	resp, err := client.Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(io.LimitReader(resp.Body, 4096))
	fmt.Fprintf(stdout, "GET %s: %s\n", u, resp.Status)
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("%s: %s", resp.Status, strings.TrimSpace(string(body)))
	}
	return nil
}

// selftestTimeout bounds each of the self-test's checks.
const selftestTimeout = 45 * time.Second

// selftestCmd is what an in-cluster Job runs: the cluster DNS resolves
// the API server's Service, and the API answers the pod's service
// account. Both run; the exit code is 0 only if both passed.
func selftestCmd(args []string, stdout, stderr io.Writer) int {
	if len(args) != 0 {
		fmt.Fprintln(stderr, "usage: testpod selftest")
		return 2
	}
	code := 0
	// Generous: under TCG a freshly started API server, busy with the
	// other pods starting, has taken more than 10 s to answer, and the
	// Job's retry of a failed pod costs minutes.
	if err := resolve(strings.TrimPrefix(apiServer, "https://"), selftestTimeout, stdout); err != nil {
		fmt.Fprintln(stderr, "testpod selftest: dns:", err)
		code = 1
	}
	if err := callAPI(apiServer, serviceAccount, selftestTimeout, stdout); err != nil {
		fmt.Fprintln(stderr, "testpod selftest: api:", err)
		code = 1
	}
	if code == 0 {
		fmt.Fprintln(stdout, "selftest passed")
	}
	return code
}
