//go:build built

package launch

import (
	"context"
	"encoding/binary"
	"net"
	"net/netip"
	"os"
	"sync"
	"testing"
	"time"

	"github.com/insomniacslk/dhcp/dhcpv4"
	"plinth.dev/plinth/internal/testutil/netprobe"
)

func newTestSwitch(t *testing.T) *Switch {
	t.Helper()
	dir, err := os.MkdirTemp("", "psw")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	s, err := NewSwitch(dir, netip.MustParsePrefix("10.42.0.0/24"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	return s
}

// TestSwitchReservesAddresses: a port's address is fixed when the port is
// made, whatever order the nodes then ask in.
func TestSwitchReservesAddresses(t *testing.T) {
	s := newTestSwitch(t)
	a := attachFakeNode(t, s, "a")
	b := attachFakeNode(t, s, "b")
	wantA, wantB := netip.MustParseAddr("10.42.0.10"), netip.MustParseAddr("10.42.0.11")
	if got, err := s.PortAddr("a"); err != nil || got != wantA {
		t.Fatalf("PortAddr(a) = %v, %v; want %v", got, err, wantA)
	}
	if got, err := s.PortAddr("b"); err != nil || got != wantB {
		t.Fatalf("PortAddr(b) = %v, %v; want %v", got, err, wantB)
	}
	if _, err := s.PortAddr("nope"); err == nil {
		t.Error("PortAddr of an unknown port succeeded")
	}
	// B asks first and still gets its own address.
	for _, tc := range []struct {
		n    *fakeNode
		want netip.Addr
	}{{b, wantB}, {a, wantA}} {
		disc, _ := dhcpv4.NewDiscovery(tc.n.mac)
		offer := tc.n.dhcpExchange(t, disc)
		if got, _ := netip.AddrFromSlice(offer.YourIPAddr.To4()); got != tc.want {
			t.Errorf("%v offered %v, want %v", tc.n.mac, got, tc.want)
		}
	}
	if l := s.Leases(); len(l) != 2 || l[a.mac.String()] != wantA || l[b.mac.String()] != wantB {
		t.Errorf("leases %v", l)
	}
	// A MAC without a port gets an address after the reserved ones.
	stranger := *a
	stranger.mac = net.HardwareAddr{0x52, 0x54, 0x00, 0x99, 0x99, 0x99}
	disc, _ := dhcpv4.NewDiscovery(stranger.mac)
	if got, _ := netip.AddrFromSlice(stranger.dhcpExchange(t, disc).YourIPAddr.To4()); got != netip.MustParseAddr("10.42.0.12") {
		t.Errorf("stranger offered %v, want 10.42.0.12", got)
	}
}

// attachFakeRouter binds the router side of a router port, standing in
// for the slirp QEMU.
func attachFakeRouter(t *testing.T, s *Switch) *fakeNode {
	t.Helper()
	local, remote, err := s.routerPort("router")
	if err != nil {
		t.Fatal(err)
	}
	conn, err := net.ListenUnixgram("unixgram", &net.UnixAddr{Name: local, Net: "unixgram"})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	return &fakeNode{conn: conn, sw: &net.UnixAddr{Name: remote, Net: "unixgram"}, mac: net.HardwareAddr{0x52, 0x55, 0x0a, 0x2a, 0x00, 0x01}}
}

// TestSwitchKeepsDHCPFromRouter: slirp behind the router port must
// neither see the nodes' DHCP nor reach them with its own; everything else
// flows as usual.
func TestSwitchKeepsDHCPFromRouter(t *testing.T) {
	s := newTestSwitch(t)
	a := attachFakeNode(t, s, "a")
	r := attachFakeRouter(t, s)

	disc, _ := dhcpv4.NewDiscovery(a.mac)
	a.dhcpExchange(t, disc)
	if f := r.recv(t, 200*time.Millisecond); f != nil {
		t.Fatalf("router port received a frame during the node's DHCP: % x", f[:14])
	}
	// The router's DHCP request is not answered, its "server reply" not
	// delivered.
	discR, _ := dhcpv4.NewDiscovery(r.mac)
	r.send(t, udpFrame(broadcastMAC, r.mac, netip.IPv4Unspecified(), netip.AddrFrom4([4]byte{255, 255, 255, 255}), 68, 67, discR.ToBytes()))
	if f := r.recv(t, 200*time.Millisecond); f != nil {
		t.Errorf("router's DHCP request was answered: % x", f[:14])
	}
	if _, err := s.PortAddr("router"); err == nil {
		t.Error("router port has an address")
	}
	r.send(t, udpFrame(broadcastMAC, r.mac, s.Addr(), netip.AddrFrom4([4]byte{255, 255, 255, 255}), 67, 68, []byte("offer")))
	if f := a.recv(t, 200*time.Millisecond); f != nil {
		t.Errorf("node received the router's DHCP reply: % x", f)
	}
	// Ordinary broadcasts still reach both ways.
	arp := append(append(append([]byte{}, broadcastMAC...), r.mac...), 0x08, 0x06, 'x')
	r.send(t, arp)
	if f := a.recv(t, 5*time.Second); string(f) != string(arp) {
		t.Errorf("node got % x, want the router's broadcast", f)
	}
	arp = append(append(append([]byte{}, broadcastMAC...), a.mac...), 0x08, 0x06, 'y')
	a.send(t, arp)
	if f := r.recv(t, 5*time.Second); string(f) != string(arp) {
		t.Errorf("router got % x, want the node's broadcast", f)
	}
}

// tcpNode answers ARP for its address and every TCP SYN with RST, like a
// host with no listening port, and counts the SYNs per port.
type tcpNode struct {
	*fakeNode
	ip netip.Addr

	mu   sync.Mutex
	syns map[uint16]int
}

func (n *tcpNode) synCount(port uint16) int {
	n.mu.Lock()
	defer n.mu.Unlock()
	return n.syns[port]
}

func (n *tcpNode) serve() {
	buf := make([]byte, 65536)
	for {
		k, _, err := n.conn.ReadFromUnix(buf)
		if err != nil {
			return
		}
		f := buf[:k]
		if len(f) < 14 {
			continue
		}
		switch binary.BigEndian.Uint16(f[12:14]) {
		case 0x0806: // ARP request for us → reply
			a := f[14:]
			if len(a) < 28 || binary.BigEndian.Uint16(a[6:8]) != 1 || netip.AddrFrom4([4]byte(a[24:28])) != n.ip {
				continue
			}
			r := make([]byte, 42)
			copy(r[0:6], a[8:14])
			copy(r[6:12], n.mac)
			binary.BigEndian.PutUint16(r[12:14], 0x0806)
			copy(r[14:20], a[0:6]) // htype, ptype, hlen, plen
			binary.BigEndian.PutUint16(r[20:22], 2)
			copy(r[22:28], n.mac)
			copy(r[28:32], a[24:28])
			copy(r[32:38], a[8:14])
			copy(r[38:42], a[14:18])
			n.conn.WriteToUnix(r, n.sw)
		case 0x0800:
			ip := f[14:]
			ihl := int(ip[0]&0x0f) * 4
			if len(ip) < ihl+20 || ip[9] != 6 || netip.AddrFrom4([4]byte(ip[16:20])) != n.ip {
				continue
			}
			tcp := ip[ihl:]
			if tcp[13]&0x02 == 0 { // not a SYN
				continue
			}
			dport := binary.BigEndian.Uint16(tcp[2:4])
			n.mu.Lock()
			n.syns[dport]++
			n.mu.Unlock()
			src := netip.AddrFrom4([4]byte(ip[12:16]))
			rst := tcpFrame(net.HardwareAddr(f[6:12]), n.mac, n.ip, src, dport, binary.BigEndian.Uint16(tcp[0:2]),
				0, binary.BigEndian.Uint32(tcp[4:8])+1, 0x14) // RST|ACK
			n.conn.WriteToUnix(rst, n.sw)
		}
	}
}

// tcpFrame builds an Ethernet/IPv4/TCP segment without payload.
func tcpFrame(dstMAC, srcMAC net.HardwareAddr, src, dst netip.Addr, sport, dport uint16, seq, ack uint32, flags byte) []byte {
	f := make([]byte, 14+20+20)
	copy(f[0:6], dstMAC)
	copy(f[6:12], srcMAC)
	binary.BigEndian.PutUint16(f[12:14], 0x0800)
	ip := f[14:34]
	ip[0] = 0x45
	binary.BigEndian.PutUint16(ip[2:4], 40)
	ip[8], ip[9] = 64, 6
	s4, d4 := src.As4(), dst.As4()
	copy(ip[12:16], s4[:])
	copy(ip[16:20], d4[:])
	binary.BigEndian.PutUint16(ip[10:12], ipChecksum(ip))
	tcp := f[34:]
	binary.BigEndian.PutUint16(tcp[0:2], sport)
	binary.BigEndian.PutUint16(tcp[2:4], dport)
	binary.BigEndian.PutUint32(tcp[4:8], seq)
	binary.BigEndian.PutUint32(tcp[8:12], ack)
	tcp[12] = 5 << 4
	tcp[13] = flags
	pseudo := append(append(append([]byte{}, s4[:]...), d4[:]...), 0, 6, 0, 20)
	binary.BigEndian.PutUint16(tcp[16:18], ipChecksum(append(pseudo, tcp...)))
	return f
}

// TestRouterForwards runs the real router QEMU against a fake node on the
// switch: a host connection to a forwarded port becomes a SYN to the
// node's address and port, and the node's RST closes it; a forward to an
// address nobody has stays open. AddForwards keeps existing host ports.
func TestRouterForwards(t *testing.T) {
	s := newTestSwitch(t)
	node := &tcpNode{fakeNode: attachFakeNode(t, s, "a"), syns: map[uint16]int{}}
	node.ip, _ = s.PortAddr("a")
	go node.serve()
	toNode := netip.AddrPortFrom(node.ip, 7835)
	nobody := netip.MustParseAddrPort("10.42.0.200:7835")
	r, err := StartRouter(context.Background(), s, t.TempDir(), []netip.AddrPort{toNode, nobody})
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	ep := r.Endpoint(toNode)
	if ep == "" || r.Endpoint(nobody) == "" || r.Endpoint(netip.MustParseAddrPort("10.42.0.10:1")) != "" {
		t.Fatalf("endpoints %q %q", ep, r.Endpoint(nobody))
	}
	if !netprobe.ClosedByPeer(t, ep, 20*time.Second) {
		t.Fatal("connection through the forward to the node's closed port stayed open")
	}
	if n := node.synCount(7835); n == 0 {
		t.Fatal("the node saw no SYN for port 7835")
	}
	if netprobe.ClosedByPeer(t, r.Endpoint(nobody), 3*time.Second) {
		t.Error("a forward to an address nobody has was closed: the test cannot tell the node answered")
	}

	mgmt := netip.AddrPortFrom(node.ip, 7836)
	if err := r.AddForwards(context.Background(), []netip.AddrPort{toNode, mgmt}); err != nil {
		t.Fatal(err)
	}
	if r.Endpoint(toNode) != ep {
		t.Errorf("restart moved the forward from %s to %s", ep, r.Endpoint(toNode))
	}
	if !netprobe.ClosedByPeer(t, r.Endpoint(mgmt), 20*time.Second) || node.synCount(7836) == 0 {
		t.Error("the added forward does not reach the node")
	}
}
