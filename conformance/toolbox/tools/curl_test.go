package tools

import (
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

func curlHandler() http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("/ok", func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("X-Test", "1")
		io.WriteString(w, "hello")
	})
	mux.HandleFunc("/404", func(w http.ResponseWriter, r *http.Request) {
		http.Error(w, "nope", http.StatusNotFound)
	})
	mux.HandleFunc("/echo", func(w http.ResponseWriter, r *http.Request) {
		b, _ := io.ReadAll(r.Body)
		fmt.Fprintf(w, "%s %s %q ua=%s accept=%s foo=%s host=%s", r.Method, r.URL.RequestURI(), b,
			r.UserAgent(), r.Header.Get("Accept"), r.Header.Get("X-Foo"), r.Host)
	})
	mux.HandleFunc("/clientip", func(w http.ResponseWriter, r *http.Request) {
		host, _, _ := net.SplitHostPort(r.RemoteAddr)
		io.WriteString(w, host)
	})
	mux.HandleFunc("/redirect", func(w http.ResponseWriter, r *http.Request) {
		http.Redirect(w, r, "/ok", http.StatusFound)
	})
	mux.HandleFunc("/slow", func(w http.ResponseWriter, r *http.Request) {
		select {
		case <-time.After(3 * time.Second):
		case <-r.Context().Done():
		}
	})
	return mux
}

func TestCurl(t *testing.T) {
	srv := httptest.NewServer(curlHandler())
	defer srv.Close()
	tlsSrv := httptest.NewTLSServer(curlHandler())
	defer tlsSrv.Close()
	hostPort := strings.TrimPrefix(srv.URL, "http://")
	refused := "127.0.0.1:" + closedPort(t)
	out := filepath.Join(t.TempDir(), "out")

	for _, tc := range []struct {
		name string
		args []string
		want result
	}{
		{"get", []string{"-g", "-q", "-s", srv.URL + "/ok"}, result{"hello", "", 0}},
		{"combined flags", []string{"-qs", srv.URL + "/ok"}, result{"hello", "", 0}},
		{"no scheme", []string{"--silent", hostPort + "/ok"}, result{"hello", "", 0}},
		{"no path", []string{"-s", "-w", "%{http_code}", "-o", "/dev/null", hostPort}, result{"404", "", 0}},
		{"status code", []string{"-g", "-q", "-s", "-o", "/dev/null", "-w", "%{http_code}", srv.URL + "/404"},
			result{"404", "", 0}},
		{"write-out escapes", []string{"-s", "-o", "/dev/null", "-w", `%{http_code}\n%%`, srv.URL + "/ok"},
			result{"200\n%", "", 0}},
		{"include", []string{"-i", "-q", "-s", srv.URL + "/ok"}, result{"HTTP/1.1 200 OK\r\n" +
			"Content-Length: 5\r\nContent-Type: text/plain; charset=utf-8\r\nDate: *\r\nX-Test: 1\r\n\r\nhello", "", 0}},
		{"include to file", []string{"-o", out, "-i", "-q", "-s", "-w", "%{http_code}", srv.URL + "/404"},
			result{"404", "", 0}},
		{"head", []string{"-sI", "-o", "/dev/null", "-w", "%{http_code}", srv.URL + "/ok"}, result{"200", "", 0}},
		{"fail", []string{"-f", "-s", srv.URL + "/404"}, result{"", "", 22}},
		{"fail shown", []string{"-fsS", "-w", "%{http_code}", srv.URL + "/404"},
			result{"404", "curl: (22) The requested URL returned error: 404\n", 22}},
		{"no fail", []string{"-s", srv.URL + "/404"}, result{"nope\n", "", 0}},
		{"no redirects", []string{"-s", "-w", " %{http_code}", srv.URL + "/redirect"},
			result{"<a href=\"/ok\">Found</a>.\n\n 302", "", 0}},
		{"defaults", []string{"-s", srv.URL + "/echo?a=b"},
			result{`GET /echo?a=b "" ua=curl/8.0 (plinth e2etools) accept=*/* foo= host=` + hostPort, "", 0}},
		{"post", []string{"-s", "-XPOST", "-H", "X-Foo: bar", "-H", "Host: example.org", srv.URL + "/echo"},
			result{`POST /echo "" ua=curl/8.0 (plinth e2etools) accept=*/* foo=bar host=example.org`, "", 0}},
		{"data", []string{"-s", "-d", "a=b", "--data", "c=d", srv.URL + "/echo"},
			result{`POST /echo "a=b&c=d" ua=curl/8.0 (plinth e2etools) accept=*/* foo= host=` + hostPort, "", 0}},
		{"request", []string{"-s", "-X", "DELETE", "-H", "User-Agent: x", srv.URL + "/echo"},
			result{`DELETE /echo "" ua=x accept=*/* foo= host=` + hostPort, "", 0}},
		{"interface", []string{"-g", "-s", "--interface", "127.0.0.1", "--connect-timeout", "3", srv.URL + "/clientip"},
			result{"127.0.0.1", "", 0}},
		{"interface not local", []string{"-s", "--interface", "192.0.2.55", srv.URL + "/ok"}, result{"", "", 45}},
		{"refused", []string{"-g", "-q", "-s", "-o", "/dev/null", "-w", "%{http_code}", "http://" + refused + "/"},
			result{"000", "", 7}},
		{"refused shown", []string{"http://" + refused + "/x"},
			result{"", "curl: (7) Failed to connect to 127.0.0.1 port " + refused[10:] + ": Connection refused\n", 7}},
		{"unresolvable", []string{"-sS", "http://bad..host/"}, result{"", "curl: (6) Could not resolve host: bad..host\n", 6}},
		{"max time", []string{"-sS", "--max-time", "0.3", srv.URL + "/slow"},
			result{"", "curl: (28) Operation timed out after * milliseconds with 0 bytes received\n", 28}},
		{"tls unverified", []string{"-s", tlsSrv.URL + "/ok"}, result{"", "", 60}},
		{"tls insecure", []string{"-k", tlsSrv.URL + "/ok"}, result{"hello", "", 0}},
		{"tls insecure long", []string{"-XGET", "-sIk", "-o", "/dev/null", "-w", "%{http_code}",
			"--header", "Authorization: Bearer x", tlsSrv.URL + "/ok"}, result{"200", "", 0}},
		{"malformed", []string{"-s", "http://[::1"}, result{"", "", 3}},
		{"protocol", []string{"-sS", "ftp://x/"}, result{"", "curl: (1) Protocol \"ftp\" not supported\n", 1}},
		{"unsupported", []string{"-Z", srv.URL}, result{"", "curl: unsupported option -Z\n", 2}},
		{"unsupported long", []string{"--compressed", srv.URL}, result{"", "curl: unsupported option --compressed\n", 2}},
		{"missing value", []string{srv.URL, "-o"}, result{"", "curl: option -o: requires parameter\n", 2}},
		{"bad number", []string{"--connect-timeout", "x", srv.URL},
			result{"", "curl: option --connect-timeout: expected a proper numerical parameter\n", 2}},
		{"no url", []string{"-s"}, result{"", "curl: no URL specified\n", 2}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got := run(curlMain, "", append([]string{"curl"}, tc.args...)...)
			// Dates and times vary: * in the wanted text matches a line's rest.
			if strings.Contains(tc.want.stdout+tc.want.stderr, "*") {
				got.stdout = maskLike(got.stdout, tc.want.stdout)
				got.stderr = maskLike(got.stderr, tc.want.stderr)
			}
			check(t, got, tc.want)
		})
	}
	if b, err := os.ReadFile(out); err != nil || !strings.HasPrefix(string(b), "HTTP/1.1 404 Not Found\r\n") ||
		!strings.HasSuffix(string(b), "\r\n\r\nnope\n") {
		t.Errorf("-o -i file: %q, %v", b, err)
	}
}

// maskLike replaces what follows a "Date: " or "after " in got with * where
// want has it.
func maskLike(got, want string) string {
	for p, term := range map[string]string{"Date: ": "\r", "after ": " "} {
		if i, j := strings.Index(got, p), strings.Index(want, p+"*"); i >= 0 && j >= 0 {
			end := strings.Index(got[i+len(p):], term)
			if end >= 0 {
				got = got[:i+len(p)] + "*" + got[i+len(p)+end:]
			}
		}
	}
	return got
}

func TestCurlVerbose(t *testing.T) {
	srv := httptest.NewServer(curlHandler())
	defer srv.Close()
	got := run(curlMain, "", "curl", "-k", "-v", "-XPOST", srv.URL+"/ok")
	for _, want := range []string{"* Connected to 127.0.0.1 (127.0.0.1) port ", "> POST /ok HTTP/1.1\n",
		"> User-Agent: curl/8.0 (plinth e2etools)\n", "< HTTP/1.1 200 OK\n", "< X-Test: 1\n"} {
		if !strings.Contains(got.stderr, want) {
			t.Errorf("stderr %q lacks %q", got.stderr, want)
		}
	}
	if got.stdout != "hello" || got.code != 0 {
		t.Errorf("stdout %q, code %d", got.stdout, got.code)
	}
}

func TestCurlConnectTimeout(t *testing.T) {
	addr := blackhole(t)
	start := time.Now()
	got := run(curlMain, "", "curl", "-g", "-q", "-s", "-w", "%{http_code}", "--connect-timeout", "0.5", "http://"+addr+"/")
	if d := time.Since(start); d < 400*time.Millisecond || d > 1500*time.Millisecond {
		t.Errorf("took %v, want about 0.5 s", d)
	}
	check(t, got, result{"000", "", 28})
	got = run(curlMain, "", "curl", "-S", "-s", "--connect-timeout", "0.2", "http://"+addr+"/")
	if got.code != 28 || !strings.HasPrefix(got.stderr, "curl: (28) Connection timed out after ") {
		t.Errorf("code %d, stderr %q", got.code, got.stderr)
	}
}

func TestCurlIPv6(t *testing.T) {
	ln, err := net.Listen("tcp6", "[::1]:0")
	if err != nil {
		t.Skip("no IPv6 loopback:", err)
	}
	srv := httptest.NewUnstartedServer(curlHandler())
	srv.Listener.Close()
	srv.Listener = ln
	srv.Start()
	defer srv.Close()
	_, port, _ := net.SplitHostPort(ln.Addr().String())
	check(t, run(curlMain, "", "curl", "-g", "-s", "--connect-timeout", "2", "http://[::1]:"+port+"/clientip"),
		result{"::1", "", 0})
	check(t, run(curlMain, "", "curl", "-s", "--interface", "::1", "[::1]:"+port+"/clientip"), result{"::1", "", 0})
}
