package tools

import (
	"bytes"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"
)

type result struct {
	stdout, stderr string
	code           int
}

// run calls a tool as the dispatcher would, with stdin's text.
func run(f Func, stdin string, args ...string) result {
	var stdout, stderr syncBuffer
	code := f(args, strings.NewReader(stdin), &stdout, &stderr)
	return result{stdout.String(), stderr.String(), code}
}

// syncBuffer is a bytes.Buffer for tools that outlive the test's reads
// (nc -lk never returns).
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

func check(t *testing.T, got result, want result) {
	t.Helper()
	if got != want {
		t.Errorf("got code %d, stdout %q, stderr %q;\nwant code %d, stdout %q, stderr %q",
			got.code, got.stdout, got.stderr, want.code, want.stdout, want.stderr)
	}
}

// closedPort is a local TCP port nothing listens on.
func closedPort(t *testing.T) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	_, port, _ := net.SplitHostPort(ln.Addr().String())
	ln.Close()
	return port
}

// blackhole is an address where a TCP connect neither succeeds nor fails
// but hangs: 192.0.2.1 (TEST-NET-1) where the network drops its packets,
// else a local listener whose accept queue is full (Linux drops the SYNs
// then), as sandboxes often reject 192.0.2.1 at once.
func blackhole(t *testing.T) string {
	t.Helper()
	if c, err := net.DialTimeout("tcp", "192.0.2.1:80", 200*time.Millisecond); err == nil {
		c.Close()
	} else if isTimeout(err) {
		return "192.0.2.1:80"
	}
	fd, err := syscall.Socket(syscall.AF_INET, syscall.SOCK_STREAM, 0)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { syscall.Close(fd) })
	if err := syscall.Bind(fd, &syscall.SockaddrInet4{Addr: [4]byte{127, 0, 0, 1}}); err != nil {
		t.Fatal(err)
	}
	if err := syscall.Listen(fd, 0); err != nil {
		t.Fatal(err)
	}
	sa, err := syscall.Getsockname(fd)
	if err != nil {
		t.Fatal(err)
	}
	addr := net.JoinHostPort("127.0.0.1", strconv.Itoa(sa.(*syscall.SockaddrInet4).Port))
	for range 8 {
		c, err := net.DialTimeout("tcp", addr, 200*time.Millisecond)
		if isTimeout(err) {
			return addr
		}
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { c.Close() })
	}
	t.Skip("no address where a connect hangs")
	return ""
}

func TestDispatch(t *testing.T) {
	dir := t.TempDir()
	passwdPath = filepath.Join(dir, "passwd")
	t.Cleanup(func() { passwdPath = "/etc/passwd" })
	if err := os.WriteFile(passwdPath, []byte("root:x:0:0:root:/root:/bin/sh\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		args       []string
		code       int
		stdout     string
		stderrPart string
	}{
		{[]string{"e2etools"}, 2, "", "tools: curl dig etcd getent nc sample-apiserver"},
		{[]string{"/usr/local/bin/e2etools"}, 2, "", "usage: e2etools TOOL"},
		{[]string{"/bin/wget", "x"}, 2, "", `unknown tool "/bin/wget"`},
		{[]string{"e2etools", "wget"}, 2, "", "tools: curl dig"},
		{[]string{"e2etools", "getent", "passwd", "root"}, 0, "root:x:0:0:root:/root:/bin/sh\n", ""},
		{[]string{"/usr/bin/getent", "passwd", "0"}, 0, "root:x:0:0:root:/root:/bin/sh\n", ""},
		{[]string{"getent", "passwd", "nobody"}, 2, "", ""},
	} {
		var stdout, stderr bytes.Buffer
		extra := map[string]Func{"etcd": nil, "sample-apiserver": nil}
		code := Main(tc.args, extra, strings.NewReader(""), &stdout, &stderr)
		if code != tc.code || stdout.String() != tc.stdout || !strings.Contains(stderr.String(), tc.stderrPart) ||
			(tc.stderrPart == "" && stderr.Len() > 0) {
			t.Errorf("%q: code %d, stdout %q, stderr %q; want %d, %q, stderr with %q",
				tc.args, code, stdout.String(), stderr.String(), tc.code, tc.stdout, tc.stderrPart)
		}
	}
}

func TestErrnoText(t *testing.T) {
	_, err := net.Dial("tcp", "127.0.0.1:"+closedPort(t))
	if got := errnoText(err); got != "Connection refused" {
		t.Errorf("errnoText(%v) = %q", err, got)
	}
	if got := errnoText(os.ErrDeadlineExceeded); got != "Connection timed out" {
		t.Errorf("errnoText(deadline) = %q", got)
	}
}

func TestParseSeconds(t *testing.T) {
	for in, want := range map[string]time.Duration{"2": 2 * time.Second, "0.5": 500 * time.Millisecond, "0": 0} {
		if got, err := parseSeconds(in); err != nil || got != want {
			t.Errorf("parseSeconds(%q) = %v, %v; want %v", in, got, err, want)
		}
	}
	for _, in := range []string{"", "x", "-1"} {
		if _, err := parseSeconds(in); err == nil {
			t.Errorf("parseSeconds(%q): no error", in)
		}
	}
}
