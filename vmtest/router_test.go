//go:build built

package vmtest

import (
	"context"
	"encoding/binary"
	"net/netip"
	"os"
	"regexp"
	"sync"
	"testing"
	"time"

	"plinth.dev/plinth/internal/testutil/netprobe"
	"plinth.dev/plinth/launch"
)

// TestRouterReachesNode boots a real node on the switch and reaches it
// through the router. The forward goes to a port nothing on the node
// listens on (9, discard), so the proof is the guest kernel's answer: its
// RST travels back through the switch (seen there, from the node's
// address and port) and slirp closes the host connection at once, whereas
// a forward to an address nobody has stays open. (A closed port keeps the
// test independent of what services the image runs.)
func TestRouterReachesNode(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*bootTimeout)
	defer cancel()
	// The switch's sockets need a short path (108 bytes at most).
	swDir, err := os.MkdirTemp("", "psw")
	if err != nil {
		t.Fatal(err)
	}
	defer os.RemoveAll(swDir)
	s, err := launch.NewSwitch(swDir, netip.MustParsePrefix("10.42.0.0/24"))
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	args, err := s.Port("a")
	if err != nil {
		t.Fatal(err)
	}
	ip, _ := s.PortAddr("a")
	var mu sync.Mutex
	rsts := 0
	s.Observe(func(port string, f []byte) {
		if port != "a" || len(f) < 14+40 || binary.BigEndian.Uint16(f[12:14]) != 0x0800 || f[14+9] != 6 {
			return
		}
		tcp := f[14+int(f[14]&0x0f)*4:]
		if netip.AddrFrom4([4]byte(f[26:30])) == ip && binary.BigEndian.Uint16(tcp[0:2]) == netprobe.ClosedPort && tcp[13]&0x04 != 0 {
			mu.Lock()
			rsts++
			mu.Unlock()
		}
	})

	m := newMachine(t, launch.BootstrapParameters())
	n := m.boot(t, ctx, "node", func(o *launch.NodeOptions) {
		o.NoNetwork = true
		o.ExtraArgs = append(o.ExtraArgs, args...)
	})
	mustLine(t, ctx, n, `I root.network: configured address .*address=`+regexp.QuoteMeta(ip.String())+`/24`)

	toNode := netip.AddrPortFrom(ip, netprobe.ClosedPort)
	nobody := netip.MustParseAddrPort("10.42.0.200:7835")
	r, err := launch.StartRouter(ctx, s, m.dir, []netip.AddrPort{toNode, nobody})
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	start := time.Now()
	if !netprobe.ClosedByPeer(t, r.Endpoint(toNode), 30*time.Second) {
		t.Fatal("connection through the forward to the node stayed open: the node's RST never came back")
	}
	t.Logf("closed by the node after %v", time.Since(start))
	mu.Lock()
	got := rsts
	mu.Unlock()
	if got == 0 {
		t.Fatal("closed, but the switch saw no RST from the node's port")
	}
	if netprobe.ClosedByPeer(t, r.Endpoint(nobody), 5*time.Second) {
		t.Error("a forward to an address nobody has was closed too")
	}
}
