package vmtest

import (
	"fmt"
	"io"
	"net"
	"os"
	"strings"
	"testing"
)

// proxyEnv makes the test binary a one-connection proxy (proxyCommand)
// instead of running tests.
const proxyEnv = "PLINTH_VMTEST_PROXY_TO"

func TestMain(m *testing.M) {
	if addr := os.Getenv(proxyEnv); addr != "" {
		os.Exit(stdioProxy(addr))
	}
	os.Exit(m.Run())
}

// proxyCommand is a GuestForward.Cmd joining the guest connection (the
// command's standard input and output) to addr: this test binary again,
// as a proxy. slirp splits the command as a shell would (glib's
// g_shell_parse_argv) but runs no shell, hence env(1).
func proxyCommand(addr string) string {
	exe, err := os.Executable()
	if err != nil {
		panic(err)
	}
	return fmt.Sprintf("env %s=%s '%s'", proxyEnv, addr, strings.ReplaceAll(exe, "'", `'\''`))
}

// stdioProxy copies standard input to a connection to addr and the
// connection to standard output. It prints nothing: its standard error
// is the guest's connection too. When the server's side ends it exits at
// once: slirp gives the command one socket as standard input, output and
// error, so only the exit closes it for the guest.
func stdioProxy(addr string) int {
	conn, err := net.Dial("tcp", addr)
	if err != nil {
		return 1
	}
	go func() {
		io.Copy(conn, os.Stdin)
		conn.(*net.TCPConn).CloseWrite()
	}()
	io.Copy(os.Stdout, conn)
	return 0
}
