package tools

import (
	"io"
	"net"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// tcpServer serves each connection with f.
func tcpServer(t *testing.T, f func(net.Conn)) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go func() {
				defer c.Close()
				f(c)
			}()
		}
	}()
	_, port, _ := net.SplitHostPort(ln.Addr().String())
	return port
}

// udpServer answers "hostName\n" with "pod-1", as agnhost netexec's UDP
// server answers with its host name; anything else it ignores.
func udpServer(t *testing.T) string {
	t.Helper()
	pc, err := net.ListenPacket("udp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { pc.Close() })
	go func() {
		buf := make([]byte, 1500)
		for {
			n, from, err := pc.ReadFrom(buf)
			if err != nil {
				return
			}
			if string(buf[:n]) == "hostName\n" {
				pc.WriteTo([]byte("pod-1"), from)
			}
		}
	}()
	_, port, _ := net.SplitHostPort(pc.LocalAddr().String())
	return port
}

func TestNC(t *testing.T) {
	// Reads to EOF, then answers: works only when nc half-closes.
	echo := tcpServer(t, func(c net.Conn) {
		b, _ := io.ReadAll(c)
		io.WriteString(c, "got:"+string(b))
	})
	// Answers a line and keeps the connection open: nc ends on -w.
	lingering := tcpServer(t, func(c net.Conn) {
		buf := make([]byte, 100)
		n, _ := c.Read(buf)
		io.WriteString(c, "line:"+string(buf[:n]))
		time.Sleep(5 * time.Second)
	})
	udp := udpServer(t)
	refused := closedPort(t)

	for _, tc := range []struct {
		name    string
		stdin   string
		args    []string
		want    result
		maxTime time.Duration
	}{
		{"tcp half-close", "hostName\n", []string{"-v", "-t", "-w", "2", "127.0.0.1", echo},
			result{"got:hostName\n", "Connection to 127.0.0.1 " + echo + " port [tcp/*] succeeded!\n", 0}, time.Second},
		{"tcp quiet", "a\nb\n", []string{"127.0.0.1", echo}, result{"got:a\nb\n", "", 0}, time.Second},
		{"tcp idle timeout", "hostName\n", []string{"-w", "1", "127.0.0.1", lingering},
			result{"line:hostName\n", "", 0}, 2 * time.Second},
		{"tcp quit after EOF", "hostName\n", []string{"-q", "0.3", "-w", "5", "127.0.0.1", lingering},
			result{"line:hostName\n", "", 0}, time.Second},
		{"tcp refused", "x", []string{"-v", "-t", "-w", "2", "127.0.0.1", refused},
			result{"", "nc: connect to 127.0.0.1 port " + refused + " (tcp) failed: Connection refused\n", 1}, time.Second},
		{"udp", "hostName\n", []string{"-u", "-w", "1", "127.0.0.1", udp}, result{"pod-1", "", 0}, 2 * time.Second},
		{"udp verbose", "hostName\n", []string{"-v", "-u", "-w", "1", "127.0.0.1", udp},
			result{"pod-1", "Connection to 127.0.0.1 " + udp + " port [udp/*] succeeded!\n", 0}, 2 * time.Second},
		{"udp joined flags", "hostName\n", []string{"-uw1", "-n", "127.0.0.1", udp}, result{"pod-1", "", 0}, 2 * time.Second},
		{"udp no answer", "other\n", []string{"-u", "-w", "0.3", "127.0.0.1", udp}, result{"", "", 0}, time.Second},
		{"udp refused", "hostName\n", []string{"-u", "-w", "1", "127.0.0.1", refused},
			result{"", "nc: read: Connection refused\n", 1}, time.Second},
		{"zero", "", []string{"-vz", "-w", "2", "127.0.0.1", echo},
			result{"", "Connection to 127.0.0.1 " + echo + " port [tcp/*] succeeded!\n", 0}, time.Second},
		{"zero quiet", "", []string{"-z", "-w", "2", "127.0.0.1", echo}, result{"", "", 0}, time.Second},
		{"zero refused", "", []string{"-z", "-w", "2", "127.0.0.1", refused},
			result{"", "nc: connect to 127.0.0.1 port " + refused + " (tcp) failed: Connection refused\n", 1}, time.Second},
		{"unresolvable", "", []string{"-z", "bad..host", "80"},
			result{"", "nc: getaddrinfo for host \"bad..host\" port 80: Name or service not known\n", 1}, time.Second},
		{"unsupported", "", []string{"-x", "proxy", "127.0.0.1", echo}, result{"", "nc: unsupported option -x\n", 2}, time.Second},
		{"no port", "", []string{"127.0.0.1"}, result{"", "usage: nc [-46dklNnUtuvz] [-p port] [-q secs] " +
			"[-s source] [-w secs] [host] [port]\n", 2}, time.Second},
	} {
		t.Run(tc.name, func(t *testing.T) {
			start := time.Now()
			got := run(ncMain, tc.stdin, append([]string{"nc"}, tc.args...)...)
			if d := time.Since(start); d > tc.maxTime {
				t.Errorf("took %v, want at most %v", d, tc.maxTime)
			}
			check(t, got, tc.want)
		})
	}
}

func TestNCConnectTimeout(t *testing.T) {
	addr := blackhole(t)
	host, port, _ := net.SplitHostPort(addr)
	start := time.Now()
	got := run(ncMain, "", "nc", "-z", "-w", "0.5", host, port)
	if d := time.Since(start); d > 1500*time.Millisecond {
		t.Errorf("took %v", d)
	}
	check(t, got, result{"", "nc: connect to " + host + " port " + port + " (tcp) failed: Connection timed out\n", 1})
}

// dialRetry connects to a listener that nc is about to open.
func dialRetry(t *testing.T, network, addr string) net.Conn {
	t.Helper()
	for range 100 {
		if c, err := net.Dial(network, addr); err == nil {
			return c
		}
		time.Sleep(20 * time.Millisecond)
	}
	t.Fatalf("nc did not listen on %s", addr)
	return nil
}

// talk sends msg, reads len(reply) bytes, half-closes (which ends nc's
// session) and returns all that came back. Reading the reply first keeps
// nc from seeing the end before it had stdin's data to send.
func talk(t *testing.T, c net.Conn, msg string, reply int) string {
	t.Helper()
	defer c.Close()
	io.WriteString(c, msg)
	c.SetReadDeadline(time.Now().Add(3 * time.Second))
	b := make([]byte, reply)
	if _, err := io.ReadFull(c, b); err != nil {
		t.Error(err)
	}
	c.(interface{ CloseWrite() error }).CloseWrite()
	rest, err := io.ReadAll(c)
	if err != nil {
		t.Error(err)
	}
	return string(b) + string(rest)
}

func TestNCListen(t *testing.T) {
	sock := filepath.Join(t.TempDir(), "asocket")
	for _, tc := range []struct {
		name, network, addr string
		args                []string
	}{
		{"-l -p", "tcp", "", []string{"-l", "-p"}},
		{"-l port", "tcp", "", []string{"-l"}},
		{"-l host port", "tcp", "127.0.0.1", []string{"-l", "127.0.0.1"}},
		{"-lU", "unix", sock, []string{"-lU", sock}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			addr, args := tc.addr, append([]string{"nc"}, tc.args...)
			if tc.network == "tcp" {
				port := closedPort(t)
				addr, args = "127.0.0.1:"+port, append(args, port)
			}
			done := make(chan result)
			go func() { done <- run(ncMain, "from-server\n", args...) }()
			if got := talk(t, dialRetry(t, tc.network, addr), "from-client\n", len("from-server\n")); got != "from-server\n" {
				t.Errorf("client got %q", got)
			}
			select {
			case got := <-done:
				check(t, got, result{"from-client\n", "", 0})
			case <-time.After(3 * time.Second):
				t.Fatal("nc -l did not end when the connection did")
			}
		})
	}
}

func TestNCListenKeep(t *testing.T) {
	port := closedPort(t)
	var stdout, stderr syncBuffer
	// Never returns: nc -lk serves until killed.
	go ncMain([]string{"nc", "-lk", "-v", "-p", port}, strings.NewReader(""), &stdout, &stderr)
	for _, msg := range []string{"one\n", "two\n"} {
		if got := talk(t, dialRetry(t, "tcp", "127.0.0.1:"+port), msg, 0); got != "" {
			t.Errorf("client got %q", got)
		}
	}
	deadline := time.Now().Add(3 * time.Second)
	for stdout.String() != "one\ntwo\n" && time.Now().Before(deadline) {
		time.Sleep(10 * time.Millisecond)
	}
	if stdout.String() != "one\ntwo\n" || strings.Count(stderr.String(), "Connection received on 127.0.0.1 ") != 2 {
		t.Errorf("stdout %q, stderr %q", stdout.String(), stderr.String())
	}
}

func TestNCListenUDP(t *testing.T) {
	port := closedPort(t)
	done := make(chan result)
	go func() { done <- run(ncMain, "reply\n", "nc", "-u", "-l", "-w", "1", port) }()
	c, err := net.Dial("udp", "127.0.0.1:"+port)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	buf := make([]byte, 100)
	reply := ""
	for i := 0; i < 50 && reply == ""; i++ { // until nc listens and answers
		io.WriteString(c, "hello\n")
		c.SetReadDeadline(time.Now().Add(100 * time.Millisecond))
		if n, err := c.Read(buf); err == nil {
			reply = string(buf[:n])
		} else {
			time.Sleep(20 * time.Millisecond)
		}
	}
	if reply != "reply\n" {
		t.Errorf("client got %q", reply)
	}
	got := <-done
	if !strings.HasPrefix(got.stdout, "hello\n") || got.code != 0 || got.stderr != "" {
		t.Errorf("got %+v", got)
	}
}
