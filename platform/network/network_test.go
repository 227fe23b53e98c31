package network

import (
	"context"
	"net"
	"net/netip"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/insomniacslk/dhcp/dhcpv4"
	"github.com/insomniacslk/dhcp/dhcpv4/nclient4"
	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"
)

func TestDeriveHostname(t *testing.T) {
	mac, _ := net.ParseMAC("52:54:00:ab:0c:de")
	if got := deriveHostname(mac); got != "plinth-ab0cde" {
		t.Errorf("deriveHostname = %q, want plinth-ab0cde", got)
	}
}

func TestPickLink(t *testing.T) {
	mac := func(s string) net.HardwareAddr { m, _ := net.ParseMAC(s); return m }
	attrs := func(i int, name, m string) netlink.LinkAttrs {
		return netlink.LinkAttrs{Index: i, Name: name, EncapType: "ether", HardwareAddr: mac(m)}
	}
	lo := &netlink.Device{LinkAttrs: netlink.LinkAttrs{Index: 1, Name: "lo", EncapType: "loopback", Flags: net.FlagLoopback, HardwareAddr: mac("00:00:00:00:00:00")}}
	wg := &netlink.Wireguard{LinkAttrs: netlink.LinkAttrs{Index: 2, Name: "wg0", EncapType: "none"}}
	veth := &netlink.Veth{LinkAttrs: attrs(3, "veth0", "02:00:00:00:00:01")}
	eth1 := &netlink.Device{LinkAttrs: attrs(5, "eth1", "02:00:00:00:00:03")}
	eth0 := &netlink.Device{LinkAttrs: attrs(4, "eth0", "02:00:00:00:00:02")}
	zero := &netlink.Device{LinkAttrs: attrs(0, "bad", "00:00:00:00:00:00")}

	if got := pickLink([]netlink.Link{lo, wg, veth, eth1, eth0, zero}); got != eth0 {
		t.Errorf("picked %v, want eth0 (the first physical NIC)", got.Attrs().Name)
	}
	if got := pickLink([]netlink.Link{lo, veth}); got != veth {
		t.Errorf("without physical NICs, want the veth, got %v", got)
	}
	if got := pickLink([]netlink.Link{lo, wg}); got != nil {
		t.Errorf("want no link, got %v", got.Attrs().Name)
	}
}

func TestParseLease(t *testing.T) {
	ack, err := dhcpv4.New(
		dhcpv4.WithMessageType(dhcpv4.MessageTypeAck),
		dhcpv4.WithYourIP(net.IPv4(10, 0, 2, 15)),
		dhcpv4.WithNetmask(net.CIDRMask(24, 32)),
		dhcpv4.WithRouter(net.IPv4(10, 0, 2, 2)),
		dhcpv4.WithDNS(net.IPv4(10, 0, 2, 3), net.IPv4(10, 0, 2, 4)),
		dhcpv4.WithOption(dhcpv4.OptDomainName("example.org")),
		dhcpv4.WithLeaseTime(600),
		dhcpv4.WithGeneric(dhcpv4.OptionInterfaceMTU, []byte{0x05, 0xb4}),
	)
	if err != nil {
		t.Fatal(err)
	}
	now := time.Now()
	l, err := parseLease(&nclient4.Lease{ACK: ack, CreationTime: now})
	if err != nil {
		t.Fatal(err)
	}
	want := netConfig{
		Address: netip.MustParsePrefix("10.0.2.15/24"),
		Gateway: netip.MustParseAddr("10.0.2.2"),
		Routes:  []route{{Dst: netip.MustParsePrefix("0.0.0.0/0"), Gw: netip.MustParseAddr("10.0.2.2")}},
		DNS:     []netip.Addr{netip.MustParseAddr("10.0.2.3"), netip.MustParseAddr("10.0.2.4")},
		Search:  []string{"example.org"},
		MTU:     1460,
	}
	if !l.cfg.equal(want) {
		t.Errorf("config = %+v\nwant %+v", l.cfg, want)
	}
	if l.duration != 10*time.Minute || l.t1 != 5*time.Minute || l.t2 != 525*time.Second {
		t.Errorf("times = %v/%v/%v, want 10m/5m/8m45s", l.duration, l.t1, l.t2)
	}
	if !l.renewAt().Equal(now.Add(5 * time.Minute)) {
		t.Errorf("renewAt = %v", l.renewAt())
	}

	// Classless routes replace the router option (RFC 3442), and a /32
	// lease with an off-subnet gateway still gets its default route.
	ack.UpdateOption(dhcpv4.OptSubnetMask(net.CIDRMask(32, 32)))
	ack.UpdateOption(dhcpv4.OptClasslessStaticRoute(
		&dhcpv4.Route{Dest: &net.IPNet{IP: net.IPv4(169, 254, 169, 254).To4(), Mask: net.CIDRMask(32, 32)}, Router: net.IPv4zero.To4()},
		&dhcpv4.Route{Dest: &net.IPNet{IP: net.IPv4zero.To4(), Mask: net.CIDRMask(0, 32)}, Router: net.IPv4(10, 0, 0, 1).To4()},
	))
	l, err = parseLease(&nclient4.Lease{ACK: ack})
	if err != nil {
		t.Fatal(err)
	}
	if l.cfg.Gateway != netip.MustParseAddr("10.0.0.1") || len(l.cfg.Routes) != 2 || l.cfg.Address.Bits() != 32 {
		t.Errorf("classless config = %+v", l.cfg)
	}
	s := New(Config{})
	r := s.nlRoute(7, l.cfg.Address, l.cfg.Routes[1], "dhcp")
	if r.Flags&int(netlink.FLAG_ONLINK) == 0 || r.Protocol != unix.RTPROT_DHCP {
		t.Errorf("off-subnet gateway route = %+v, want onlink, proto dhcp", r)
	}
	if r := s.nlRoute(7, l.cfg.Address, l.cfg.Routes[0], "dhcp"); r.Scope != netlink.SCOPE_LINK || r.Gw != nil {
		t.Errorf("link route = %+v, want scope link without gateway", r)
	}
}

func TestWriteFileFollowsDanglingSymlink(t *testing.T) {
	dir := t.TempDir()
	etc := filepath.Join(dir, "etc")
	if err := os.MkdirAll(etc, 0o755); err != nil {
		t.Fatal(err)
	}
	// As on the node: /etc/resolv.conf -> ../run/net/resolv.conf, whose
	// directory does not exist yet.
	link := filepath.Join(etc, "resolv.conf")
	if err := os.Symlink("../run/net/resolv.conf", link); err != nil {
		t.Fatal(err)
	}
	data := resolvConf([]netip.Addr{netip.MustParseAddr("192.0.2.53")}, []string{"a.test", "b.test"}, "dhcp", "eth0")
	if err := writeFile(link, data); err != nil {
		t.Fatal(err)
	}
	if fi, err := os.Lstat(link); err != nil || fi.Mode()&os.ModeSymlink == 0 {
		t.Fatalf("symlink replaced: %v %v", fi, err)
	}
	got, err := os.ReadFile(filepath.Join(dir, "run", "net", "resolv.conf"))
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(string(got), "nameserver 192.0.2.53\n") || !strings.Contains(string(got), "search a.test b.test\n") {
		t.Errorf("resolv.conf = %q", got)
	}
	// Rewriting identical content is a no-op; new content replaces it.
	if err := writeFile(link, []byte("x\n")); err != nil {
		t.Fatal(err)
	}
	if got, _ := os.ReadFile(link); string(got) != "x\n" {
		t.Errorf("after rewrite: %q", got)
	}
	if ents, _ := os.ReadDir(filepath.Join(dir, "run", "net")); len(ents) != 1 {
		t.Errorf("temporary files left behind: %v", ents)
	}
}

func TestWaitAddress(t *testing.T) {
	s := New(Config{})
	if _, ok := s.Status(); ok {
		t.Fatal("status before any address")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Millisecond)
	defer cancel()
	if _, err := s.WaitAddress(ctx); err == nil {
		t.Fatal("WaitAddress returned without an address")
	}
	want := Status{Interface: "eth0", Address: netip.MustParsePrefix("192.0.2.9/24"), Source: "dhcp", DNS: []netip.Addr{netip.MustParseAddr("192.0.2.53")}}
	go func() {
		time.Sleep(10 * time.Millisecond)
		s.setStatus(&want)
	}()
	st, err := s.WaitAddress(context.Background())
	if err != nil || st.Address != want.Address {
		t.Fatalf("WaitAddress = %+v, %v", st, err)
	}
	st.DNS[0] = netip.Addr{}
	if st2, _ := s.Status(); st2.DNS[0] != want.DNS[0] {
		t.Error("Status shares its DNS slice with callers")
	}
}
