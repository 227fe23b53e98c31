//go:build built

package launch

import (
	"bytes"
	"encoding/binary"
	"net"
	"net/netip"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/insomniacslk/dhcp/dhcpv4"
)

// fakeNode stands in for QEMU's side of "-netdev dgram": it binds the
// node socket named in the port's args and sends to the switch socket.
type fakeNode struct {
	conn *net.UnixConn
	sw   *net.UnixAddr
	mac  net.HardwareAddr
}

func attachFakeNode(t *testing.T, s *Switch, name string) *fakeNode {
	t.Helper()
	args, err := s.Port(name)
	if err != nil {
		t.Fatal(err)
	}
	if len(args) != 4 || args[0] != "-netdev" || args[2] != "-device" {
		t.Fatalf("unexpected args %q", args)
	}
	opts := map[string]string{}
	for _, kv := range strings.Split(args[1], ",")[1:] {
		k, v, _ := strings.Cut(kv, "=")
		opts[k] = v
	}
	macStr := args[3][strings.Index(args[3], "mac=")+len("mac="):]
	mac, err := net.ParseMAC(macStr)
	if err != nil {
		t.Fatal(err)
	}
	conn, err := net.ListenUnixgram("unixgram", &net.UnixAddr{Name: opts["local.path"], Net: "unixgram"})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	return &fakeNode{conn: conn, sw: &net.UnixAddr{Name: opts["remote.path"], Net: "unixgram"}, mac: mac}
}

func (n *fakeNode) send(t *testing.T, f []byte) {
	t.Helper()
	if _, err := n.conn.WriteToUnix(f, n.sw); err != nil {
		t.Fatal(err)
	}
}

// recv returns the next frame, or nil if none arrives within d.
func (n *fakeNode) recv(t *testing.T, d time.Duration) []byte {
	t.Helper()
	buf := make([]byte, 65536)
	n.conn.SetReadDeadline(time.Now().Add(d))
	k, _, err := n.conn.ReadFromUnix(buf)
	if err != nil {
		if ne, ok := err.(net.Error); ok && ne.Timeout() {
			return nil
		}
		t.Fatal(err)
	}
	return buf[:k]
}

// dhcpExchange sends msg from n and returns the parsed reply, checking the
// IPv4 header on the way so that a bad checksum would fail here rather than
// in a guest kernel that silently drops the frame.
func (n *fakeNode) dhcpExchange(t *testing.T, msg *dhcpv4.DHCPv4) *dhcpv4.DHCPv4 {
	t.Helper()
	n.send(t, udpFrame(broadcastMAC, n.mac, netip.IPv4Unspecified(),
		netip.AddrFrom4([4]byte{255, 255, 255, 255}), 68, 67, msg.ToBytes()))
	f := n.recv(t, 5*time.Second)
	if f == nil {
		t.Fatal("no DHCP reply")
	}
	if binary.BigEndian.Uint16(f[12:14]) != 0x0800 || ipChecksum(f[14:34]) != 0 {
		t.Fatalf("bad IPv4 frame header % x", f[:34])
	}
	if sp, dp := binary.BigEndian.Uint16(f[34:36]), binary.BigEndian.Uint16(f[36:38]); sp != 67 || dp != 68 {
		t.Fatalf("reply ports %d->%d", sp, dp)
	}
	reply, err := dhcpv4.FromBytes(f[42:])
	if err != nil {
		t.Fatal(err)
	}
	return reply
}

func TestSwitch(t *testing.T) {
	dir, err := os.MkdirTemp("", "psw")
	if err != nil {
		t.Fatal(err)
	}
	defer os.RemoveAll(dir)
	subnet := netip.MustParsePrefix("10.42.0.0/24")
	s, err := NewSwitch(dir, subnet)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	a := attachFakeNode(t, s, "a")
	b := attachFakeNode(t, s, "b")
	c := attachFakeNode(t, s, "c")
	if bytes.Equal(a.mac, b.mac) || bytes.Equal(b.mac, c.mac) {
		t.Fatalf("ports share a MAC: %v %v %v", a.mac, b.mac, c.mac)
	}

	disc, err := dhcpv4.NewDiscovery(a.mac)
	if err != nil {
		t.Fatal(err)
	}
	offer := a.dhcpExchange(t, disc)
	if offer.MessageType() != dhcpv4.MessageTypeOffer {
		t.Fatalf("got %v, want OFFER", offer.MessageType())
	}
	got, _ := netip.AddrFromSlice(offer.YourIPAddr.To4())
	if !subnet.Contains(got) || got.As4()[3] < 10 {
		t.Fatalf("offered %v, want an address from 10.42.0.10 up", got)
	}
	if r := offer.Router(); len(r) != 1 || !r[0].Equal(net.IPv4(10, 42, 0, 1)) {
		t.Errorf("router %v", r)
	}
	if m := offer.SubnetMask(); m.String() != net.CIDRMask(24, 32).String() {
		t.Errorf("netmask %v", m)
	}

	req, err := dhcpv4.NewRequestFromOffer(offer)
	if err != nil {
		t.Fatal(err)
	}
	ack := a.dhcpExchange(t, req)
	if ack.MessageType() != dhcpv4.MessageTypeAck || !ack.YourIPAddr.Equal(offer.YourIPAddr) {
		t.Fatalf("got %v for %v, want ACK for %v", ack.MessageType(), ack.YourIPAddr, offer.YourIPAddr)
	}
	if ack.IPAddressLeaseTime(0) != time.Hour {
		t.Errorf("lease time %v", ack.IPAddressLeaseTime(0))
	}
	if l := s.Leases(); len(l) != 1 || l[a.mac.String()] != got {
		t.Errorf("leases %v, want %v -> %v", l, a.mac, got)
	}
	// The lease is stable per MAC; a second client gets the next address.
	if again := a.dhcpExchange(t, disc); !again.YourIPAddr.Equal(offer.YourIPAddr) {
		t.Errorf("re-DISCOVER offered %v, want %v", again.YourIPAddr, offer.YourIPAddr)
	}
	discB, _ := dhcpv4.NewDiscovery(b.mac)
	if ob := b.dhcpExchange(t, discB); ob.YourIPAddr.Equal(offer.YourIPAddr) {
		t.Errorf("B offered A's address %v", ob.YourIPAddr)
	}
	// DHCP is answered by the switch, never flooded to other nodes.
	if f := c.recv(t, 100*time.Millisecond); f != nil {
		t.Fatalf("C received a DHCP frame % x", f[:14])
	}

	// A broadcast from B floods to A and C, and teaches the switch B's port.
	bcast := append(append(append([]byte{}, broadcastMAC...), b.mac...), 0x88, 0xb5, 'h', 'i')
	b.send(t, bcast)
	for _, n := range []*fakeNode{a, c} {
		if f := n.recv(t, 5*time.Second); !bytes.Equal(f, bcast) {
			t.Fatalf("broadcast: got % x", f)
		}
	}
	// A unicast to B's learned MAC reaches B only.
	uni := append(append(append([]byte{}, b.mac...), a.mac...), 0x88, 0xb5, 'y', 'o')
	a.send(t, uni)
	if f := b.recv(t, 5*time.Second); !bytes.Equal(f, uni) {
		t.Fatalf("unicast: B got % x", f)
	}
	if f := c.recv(t, 200*time.Millisecond); f != nil {
		t.Fatalf("unicast leaked to C: % x", f)
	}
	if f := a.recv(t, 50*time.Millisecond); f != nil {
		t.Fatalf("unicast echoed to A: % x", f)
	}

	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
}
