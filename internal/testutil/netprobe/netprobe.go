// Package netprobe tells from the host whether a guest behind a QEMU
// user-network (slirp) forward answered a connection, for the launcher's
// router tests and the VM tests that reach a node through it.
package netprobe

import (
	"errors"
	"io"
	"net"
	"syscall"
	"testing"
	"time"
)

// ClosedPort is a port no Plinth node listens on (discard): a forward to
// it proves the node is reached by the guest kernel's RST, whatever
// services the image runs.
const ClosedPort = 9

// ClosedByPeer connects to a forwarded port and reports whether the far
// side closed the connection within d. slirp accepts on the host at once
// and only then connects to the guest, so a guest that refuses (RST)
// shows up as EOF (or a reset) on an accepted connection, while a guest
// that never answers leaves the connection open.
func ClosedByPeer(t testing.TB, addr string, d time.Duration) bool {
	t.Helper()
	c, err := net.DialTimeout("tcp", addr, 5*time.Second)
	if err != nil {
		t.Fatalf("connecting to the forwarded port %s: %v", addr, err)
	}
	defer c.Close()
	c.SetReadDeadline(time.Now().Add(d))
	_, err = c.Read(make([]byte, 1))
	if ne, ok := err.(net.Error); ok && ne.Timeout() {
		return false
	}
	if !errors.Is(err, io.EOF) && !errors.Is(err, syscall.ECONNRESET) {
		t.Fatalf("reading from %s: %v, want EOF, a reset or a timeout", addr, err)
	}
	return true
}
