package main

import (
	"bytes"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"io"
	"log"
	"math/big"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

func runCmd(args ...string) (int, string, string) {
	var out, errOut strings.Builder
	code := run(args, &out, &errOut)
	return code, out.String(), errOut.String()
}

func TestUsageAndPrint(t *testing.T) {
	if code, _, errOut := runCmd(); code != 2 || !strings.Contains(errOut, "testpod selftest") {
		t.Errorf("no args: %d %q", code, errOut)
	}
	if code, _, errOut := runCmd("nope"); code != 2 || !strings.Contains(errOut, `unknown command "nope"`) {
		t.Errorf("unknown: %d %q", code, errOut)
	}
	if code, out, _ := runCmd("print", "hello", "world"); code != 0 || out != "hello world\n" {
		t.Errorf("print: %d %q", code, out)
	}
	f := filepath.Join(t.TempDir(), "f")
	os.WriteFile(f, []byte("Seccomp:\t2\n"), 0o644)
	if code, out, _ := runCmd("cat", f, f); code != 0 || out != "Seccomp:\t2\nSeccomp:\t2\n" {
		t.Errorf("cat: %d %q", code, out)
	}
	if code, _, errOut := runCmd("cat", f+"-missing"); code != 1 || !strings.Contains(errOut, "no such file") {
		t.Errorf("cat of a missing file: %d %q", code, errOut)
	}
}

func TestPause(t *testing.T) {
	sigs := make(chan os.Signal, 4)
	reaped := 0
	sigs <- unix.SIGCHLD
	sigs <- unix.SIGCHLD
	sigs <- unix.SIGTERM
	if code := pause(sigs, true, func() { reaped++ }); code != 0 || reaped != 2 {
		t.Errorf("pause as PID 1: exit %d, reaped %d times", code, reaped)
	}
	sigs <- unix.SIGCHLD
	sigs <- unix.SIGINT
	if code := pause(sigs, false, func() { reaped++ }); code != 0 || reaped != 2 {
		t.Errorf("pause not PID 1: exit %d, reaped %d times (must not reap)", code, reaped)
	}
}

func TestServeHandler(t *testing.T) {
	host, _ := os.Hostname()
	for path, want := range map[string]string{"/": "hello from " + host + "\n", "/healthz": "ok\n"} {
		rec := httptest.NewRecorder()
		handler().ServeHTTP(rec, httptest.NewRequest(http.MethodGet, path, nil))
		if rec.Code != 200 || rec.Body.String() != want {
			t.Errorf("GET %s: %d %q, want %q", path, rec.Code, rec.Body.String(), want)
		}
	}
	rec := httptest.NewRecorder()
	handler().ServeHTTP(rec, httptest.NewRequest(http.MethodGet, "/other", nil))
	if rec.Code != 404 {
		t.Errorf("GET /other: %d", rec.Code)
	}
}

func TestDNS(t *testing.T) {
	// localhost comes from /etc/hosts; a name that is not a valid domain
	// name fails at once, without asking a DNS server.
	if code, out, errOut := runCmd("dns", "localhost"); code != 0 || !strings.Contains(out, "127.0.0.1") {
		t.Errorf("dns localhost: %d %q %q", code, out, errOut)
	}
	if code, _, errOut := runCmd("dns", "plinth..test"); code != 1 || !strings.Contains(errOut, "no such host") {
		t.Errorf("dns of a name that cannot resolve: %d %q", code, errOut)
	}
	if code, _, _ := runCmd("dns"); code != 2 {
		t.Errorf("dns without a name: %d", code)
	}
}

// fakeAPI serves the pod list for namespace "testns" to the token
// "secret-token", 403 otherwise, and writes a service account directory
// for it.
func fakeAPI(t *testing.T, token string) (*httptest.Server, string) {
	t.Helper()
	srv := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path != "/api/v1/namespaces/testns/pods" || r.URL.Query().Get("limit") != "1" {
			http.NotFound(w, r)
			return
		}
		if r.Header.Get("Authorization") != "Bearer secret-token" {
			http.Error(w, `{"kind":"Status","reason":"Forbidden"}`, http.StatusForbidden)
			return
		}
		w.Write([]byte(`{"kind":"PodList","items":[]}`))
	}))
	srv.Config.ErrorLog = log.New(io.Discard, "", 0) // refused handshakes are part of the test
	srv.StartTLS()
	t.Cleanup(srv.Close)
	dir := t.TempDir()
	ca := pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: srv.Certificate().Raw})
	for name, data := range map[string]string{"token": token + "\n", "namespace": "testns", "ca.crt": string(ca)} {
		if err := os.WriteFile(filepath.Join(dir, name), []byte(data), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	return srv, dir
}

func TestAPI(t *testing.T) {
	srv, dir := fakeAPI(t, "secret-token")
	code, out, errOut := runCmd("api", "-server", srv.URL, "-account", dir)
	if code != 0 || !strings.Contains(out, "/api/v1/namespaces/testns/pods?limit=1: 200 OK") {
		t.Errorf("api: %d %q %q", code, out, errOut)
	}

	srv, dir = fakeAPI(t, "wrong-token")
	code, out, errOut = runCmd("api", "-server", srv.URL, "-account", dir)
	if code != 1 || !strings.Contains(out, "403 Forbidden") || !strings.Contains(errOut, "Forbidden") {
		t.Errorf("api with a refused token: %d %q %q", code, out, errOut)
	}

	// A service account whose CA did not sign the server's certificate.
	key, _ := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	tmpl := &x509.Certificate{SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "other CA"},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour), IsCA: true, BasicConstraintsValid: true}
	der, _ := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	os.WriteFile(filepath.Join(dir, "ca.crt"), pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}), 0o600)
	if code, _, errOut := runCmd("api", "-server", srv.URL, "-account", dir); code != 1 || !strings.Contains(errOut, "certificate") {
		t.Errorf("api against an untrusted server: %d %q", code, errOut)
	}
	if code, _, errOut := runCmd("api", "-server", srv.URL, "-account", t.TempDir()); code != 1 || !strings.Contains(errOut, "service account") {
		t.Errorf("api without a service account: %d %q", code, errOut)
	}
}

func TestGet(t *testing.T) {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/missing" {
			http.NotFound(w, r)
			return
		}
		io.WriteString(w, "hello")
	}))
	defer srv.Close()
	var out, errb bytes.Buffer
	if code := run([]string{"get", srv.URL}, &out, &errb); code != 0 || out.String() != "hello" {
		t.Fatalf("get: %d %q %q", code, out.String(), errb.String())
	}
	if code := run([]string{"get", srv.URL + "/missing"}, &out, &errb); code == 0 {
		t.Fatal("get of a 404 succeeded")
	}
}

// TestWriteAndFill: write and fill write what they say, and a write that
// fails names its errno (the VM test looks for EDQUOT or ENOSPC).
func TestWriteAndFill(t *testing.T) {
	dir := t.TempDir()
	var out, errOut strings.Builder
	if code := run([]string{"write", dir + "/a", "hello"}, &out, &errOut); code != 0 {
		t.Fatalf("write: %d %s", code, errOut.String())
	}
	if b, err := os.ReadFile(dir + "/a"); err != nil || string(b) != "hello" {
		t.Fatalf("written: %q, %v", b, err)
	}
	if code := run([]string{"fill", dir + "/b", "100000"}, &out, &errOut); code != 0 || !strings.Contains(out.String(), "wrote 100000 bytes") {
		t.Fatalf("fill: %d %s %s", code, out.String(), errOut.String())
	}
	if st, err := os.Stat(dir + "/b"); err != nil || st.Size() != 100000 {
		t.Fatalf("filled: %v, %v", st, err)
	}
	// /dev/full: every write is ENOSPC.
	errOut.Reset()
	if code := run([]string{"fill", "/dev/full", "10"}, &out, &errOut); code != 1 || !strings.Contains(errOut.String(), "(ENOSPC)") {
		t.Fatalf("fill /dev/full: %d %q", code, errOut.String())
	}
	if code := run([]string{"fill", dir + "/c", "x"}, &out, &errOut); code != 2 {
		t.Fatalf("fill with a bad size: %d", code)
	}
}

func TestSpin(t *testing.T) {
	stop := make(chan os.Signal, 1)
	done := make(chan int)
	go func() { done <- spin(stop) }()
	select {
	case <-done:
		t.Fatal("spin returned before the signal")
	case <-time.After(50 * time.Millisecond):
	}
	stop <- os.Interrupt
	select {
	case code := <-done:
		if code != 0 {
			t.Errorf("spin exited %d, want 0", code)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("spin still running after the signal")
	}
}
