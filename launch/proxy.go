package launch

import (
	"fmt"
	"io"
	"net"
	"os"
	"strings"
)

// A guest forward to a server in this process (the Registry, the
// network-boot server) needs a command for slirp to run per connection:
// this executable again, as a one-connection proxy. Every program that
// uses ProxyCommand calls MaybeProxy first thing (the VM tests' TestMain,
// the conformance runner's main).

// proxyEnv makes the executable a one-connection proxy (ProxyCommand)
// instead of doing its own work.
const proxyEnv = "PLINTH_VMTEST_PROXY_TO"

// MaybeProxy, in a process ProxyCommand started, proxies its connection
// and exits; elsewhere it returns at once.
func MaybeProxy() {
	if addr := os.Getenv(proxyEnv); addr != "" {
		os.Exit(stdioProxy(addr))
	}
}

// ProxyCommand is a GuestForward.Cmd joining the guest connection (the
// command's standard input and output) to addr: this executable again,
// as a proxy (MaybeProxy). slirp splits the command as a shell would
// (glib's g_shell_parse_argv) but runs no shell, hence env(1).
func ProxyCommand(addr string) string {
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
