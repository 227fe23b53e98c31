package launch

import (
	"encoding/binary"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"

	"github.com/insomniacslk/dhcp/dhcpv4"
)

// Switch is an L2 Ethernet switch in the test process joining QEMU nodes
// through unix datagram sockets, with a built-in DHCPv4 server.
//
// It exists so that the nodes of one test share a private network without
// root: no tap devices, no bridges, no network namespaces. Each node's QEMU
// runs "-netdev dgram" between its own socket and one switch port; every
// datagram is one raw Ethernet frame. The switch learns source MACs and
// floods unknown or broadcast destinations, like a real unmanaged switch.
// DHCP requests are answered here rather than forwarded, so guests configure
// themselves exactly as they would on a real LAN.
//
// Every port's address is reserved when the port is made (PortAddr), in
// the order ports are made, so a test knows a node's address before the
// node boots (the Router needs it for its port forwards). A router port
// (see Router) gets no address and never sees DHCP traffic: the slirp
// stack behind it would answer DHCP requests too.
type Switch struct {
	dir    string
	subnet netip.Prefix
	addr   netip.Addr // switch address: router, DNS and DHCP server id
	mac    net.HardwareAddr

	mu     sync.Mutex
	ports  []*swPort
	table  map[[6]byte]*swPort   // learned MAC -> port
	leases map[string]netip.Addr // MAC string -> leased address
	// reserved holds the address of every port's MAC (MAC string ->
	// address), made with the port; lease hands it out.
	reserved map[string]netip.Addr
	next     netip.Addr // next address to reserve or hand out
	bootFile string     // DHCP boot file (SetBootFile)
	closed   bool
	done     chan struct{} // closed by Close
	wg       sync.WaitGroup

	// observe, if set (Observe), sees every frame entering the switch
	// with the name of the port it came from.
	observe func(port string, frame []byte)
}

type swPort struct {
	name   string
	conn   *net.UnixConn
	path   string // switch-side socket, removed on Close
	remote *net.UnixAddr
	mac    net.HardwareAddr // the NIC's MAC; nil for a router port
	router bool
	// out queues the frames to send to the port (see send).
	out chan []byte
}

// portQueue is how many frames wait for a port that does not read; more
// are dropped, as a real switch drops what overflows its buffers.
const portQueue = 512

// NewSwitch creates a switch whose sockets live in dir. dir must be short
// because unix socket paths are limited to about 107 bytes; callers should
// use os.MkdirTemp("", "psw") rather than t.TempDir(). The switch takes the
// first host address of subnet; leases start at the tenth.
func NewSwitch(dir string, subnet netip.Prefix) (*Switch, error) {
	subnet = subnet.Masked()
	if !subnet.Addr().Is4() || subnet.Bits() > 27 {
		return nil, fmt.Errorf("launch: switch subnet %v: need an IPv4 prefix of /27 or shorter", subnet)
	}
	addr := subnet.Addr().Next()
	next := addr
	for range 9 {
		next = next.Next()
	}
	return &Switch{
		dir:    dir,
		subnet: subnet,
		addr:   addr,
		// Locally administered, so it cannot collide with QEMU's 52:54:00 MACs.
		mac:      net.HardwareAddr{0x02, 0x00, 0x00, 0x00, 0x00, 0x01},
		table:    map[[6]byte]*swPort{},
		leases:   map[string]netip.Addr{},
		reserved: map[string]netip.Addr{},
		next:     next,
		done:     make(chan struct{}),
	}, nil
}

// Subnet is the switch's network.
func (s *Switch) Subnet() netip.Prefix { return s.subnet }

// Addr returns the switch's own address (the guests' router and DNS).
func (s *Switch) Addr() netip.Addr { return s.addr }

// Port creates the switch-side socket for one node and returns the QEMU
// arguments that attach the node's NIC to it (append them to ExtraArgs and
// set NoNetwork). Each port gets a unique MAC, so Leases can be mapped back
// to nodes. QEMU binds the node-side path itself; until it does, frames to
// that node are dropped, as on an unplugged cable. The port's address is
// reserved now (PortAddr); a switch whose subnet is used up refuses the
// port. The same arguments serve every later launch of the node.
func (s *Switch) Port(name string) (qemuArgs []string, err error) {
	p, err := s.addPort(name, false)
	if err != nil {
		return nil, err
	}
	return []string{
		"-netdev", fmt.Sprintf("dgram,id=lan0,local.type=unix,local.path=%s,remote.type=unix,remote.path=%s",
			qemuOpt(p.remote.Name), qemuOpt(p.path)),
		"-device", "virtio-net-pci,netdev=lan0,mac=" + p.mac.String(),
	}, nil
}

// PortAddr is the address the switch's DHCP server gives the node on port
// name (made by Port).
func (s *Switch) PortAddr(name string) (netip.Addr, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, p := range s.ports {
		if p.name == name && !p.router {
			return s.reserved[p.mac.String()], nil
		}
	}
	return netip.Addr{}, fmt.Errorf("launch: switch has no node port %q", name)
}

// routerPort makes a port for a Router: no address, no DHCP. It returns
// the QEMU-side socket path (to bind) and the switch-side one (to send to).
func (s *Switch) routerPort(name string) (local, remote string, err error) {
	p, err := s.addPort(name, true)
	if err != nil {
		return "", "", err
	}
	return p.remote.Name, p.path, nil
}

func (s *Switch) addPort(name string, router bool) (*swPort, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return nil, errors.New("launch: switch closed")
	}
	n := len(s.ports) + 1
	if n > 0xffff {
		return nil, errors.New("launch: too many switch ports")
	}
	p := &swPort{name: name, router: router, path: filepath.Join(s.dir, name+"-sw.sock"),
		remote: &net.UnixAddr{Name: filepath.Join(s.dir, name+".sock"), Net: "unixgram"},
		out:    make(chan []byte, portQueue)}
	var addr netip.Addr
	if !router {
		p.mac = net.HardwareAddr{0x52, 0x54, 0x00, 0x5e, byte(n >> 8), byte(n)}
		var ok bool
		if addr, ok = s.allocLocked(); !ok {
			return nil, fmt.Errorf("launch: switch port %s: no free address left in %v", name, s.subnet)
		}
	}
	conn, err := net.ListenUnixgram("unixgram", &net.UnixAddr{Name: p.path, Net: "unixgram"})
	if err != nil {
		if addr.IsValid() {
			s.next = addr // give the address back: nothing else took one since
		}
		return nil, fmt.Errorf("launch: switch port %s: %w", name, err)
	}
	p.conn = conn
	if addr.IsValid() {
		s.reserved[p.mac.String()] = addr
	}
	s.ports = append(s.ports, p)
	s.wg.Add(2)
	go s.serve(p)
	go s.send(p)
	return p, nil
}

// Leases returns a copy of the addresses handed out, keyed by MAC.
func (s *Switch) Leases() map[string]netip.Addr {
	s.mu.Lock()
	defer s.mu.Unlock()
	m := make(map[string]netip.Addr, len(s.leases))
	for k, v := range s.leases {
		m[k] = v
	}
	return m
}

// Close stops all ports and removes their sockets.
func (s *Switch) Close() error {
	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		return nil
	}
	s.closed = true
	close(s.done)
	ports := s.ports
	s.mu.Unlock()
	var errs []error
	for _, p := range ports {
		errs = append(errs, p.conn.Close())
		if err := os.Remove(p.path); err != nil && !errors.Is(err, os.ErrNotExist) {
			errs = append(errs, err)
		}
	}
	s.wg.Wait()
	return errors.Join(errs...)
}

func (s *Switch) serve(p *swPort) {
	defer s.wg.Done()
	buf := make([]byte, 65536)
	for {
		n, _, err := p.conn.ReadFromUnix(buf)
		if err != nil {
			if errors.Is(err, net.ErrClosed) {
				return
			}
			continue
		}
		s.handle(p, append([]byte(nil), buf[:n]...))
	}
}

// send writes the frames queued for p. A unix datagram socket blocks its
// sender while the receiver's queue is full, and a QEMU whose guest has not
// brought its NIC up yet (a node booting) stops reading: one sender per
// port keeps that port's backlog from stalling the frames of every other
// port, which a write from handle would (every node would lose the
// network while one boots).
func (s *Switch) send(p *swPort) {
	defer s.wg.Done()
	for {
		select {
		case f := <-p.out:
			// Errors mean the node is not (yet, or any more) listening:
			// drop, as a real switch does for a dead link.
			_, _ = p.conn.WriteToUnix(f, p.remote)
		case <-s.done:
			return
		}
	}
}

// enqueue queues f for p, dropping it if p's queue is full.
func enqueue(p *swPort, f []byte) {
	select {
	case p.out <- f:
	default:
	}
}

func (s *Switch) handle(in *swPort, f []byte) {
	if len(f) < 14 {
		return
	}
	var dst, src [6]byte
	copy(dst[:], f[0:6])
	copy(src[:], f[6:12])
	s.mu.Lock()
	if src[0]&1 == 0 {
		s.table[src] = in
	}
	observe := s.observe
	s.mu.Unlock()
	if observe != nil {
		observe(in.name, f)
	}
	if payload, ok := dhcpPayload(f); ok {
		// Requests are answered here; one from the router (slirp never
		// sends any) is dropped rather than answered.
		if !in.router {
			s.dhcp(in, payload)
		}
		return
	}
	isDHCP := dhcpReply(f)
	if isDHCP && in.router {
		// slirp's own DHCP server must never reach a node.
		return
	}
	s.mu.Lock()
	var out []*swPort
	if to, ok := s.table[dst]; ok && dst[0]&1 == 0 {
		if to != in {
			out = []*swPort{to}
		}
	} else {
		for _, p := range s.ports {
			if p != in {
				out = append(out, p)
			}
		}
	}
	s.mu.Unlock()
	if isDHCP {
		out = slices.DeleteFunc(out, func(p *swPort) bool { return p.router })
	}
	for _, p := range out {
		enqueue(p, f)
	}
}

// dhcpPayload returns the UDP payload of an IPv4 UDP frame to port 67.
func dhcpPayload(f []byte) ([]byte, bool) {
	udp, ok := udpSegment(f)
	if !ok || binary.BigEndian.Uint16(udp[2:4]) != 67 {
		return nil, false
	}
	ulen := int(binary.BigEndian.Uint16(udp[4:6]))
	if ulen < 8 || ulen > len(udp) {
		return nil, false
	}
	return udp[8:ulen], true
}

// dhcpReply reports whether f is an IPv4 UDP frame to the DHCP client port
// (a DHCP server's answer).
func dhcpReply(f []byte) bool {
	udp, ok := udpSegment(f)
	return ok && binary.BigEndian.Uint16(udp[2:4]) == 68
}

// udpSegment returns the UDP header and payload of an IPv4 UDP frame.
func udpSegment(f []byte) ([]byte, bool) {
	if len(f) < 14+20 || binary.BigEndian.Uint16(f[12:14]) != 0x0800 {
		return nil, false
	}
	ip := f[14:]
	ihl := int(ip[0]&0x0f) * 4
	if ip[0]>>4 != 4 || ihl < 20 || ip[9] != 17 || len(ip) < ihl+8 {
		return nil, false
	}
	return ip[ihl:], true
}

func (s *Switch) dhcp(in *swPort, payload []byte) {
	req, err := dhcpv4.FromBytes(payload)
	if err != nil || req.OpCode != dhcpv4.OpcodeBootRequest {
		return
	}
	var reply dhcpv4.MessageType
	switch req.MessageType() {
	case dhcpv4.MessageTypeDiscover:
		reply = dhcpv4.MessageTypeOffer
	case dhcpv4.MessageTypeRequest:
		// A REQUEST naming another server is meant for it; stay silent.
		if id := req.ServerIdentifier(); id != nil && !id.Equal(s.addr.AsSlice()) {
			return
		}
		reply = dhcpv4.MessageTypeAck
	default:
		return
	}
	ip, ok := s.lease(req.ClientHWAddr)
	if !ok {
		return
	}
	srv := net.IP(s.addr.AsSlice())
	resp, err := dhcpv4.NewReplyFromRequest(req,
		dhcpv4.WithMessageType(reply),
		dhcpv4.WithYourIP(ip.AsSlice()),
		dhcpv4.WithServerIP(srv),
		dhcpv4.WithOption(dhcpv4.OptServerIdentifier(srv)),
		dhcpv4.WithLeaseTime(3600),
		dhcpv4.WithRouter(srv),
		dhcpv4.WithDNS(srv),
		dhcpv4.WithNetmask(net.CIDRMask(s.subnet.Bits(), 32)),
	)
	if err != nil {
		return
	}
	if url := s.BootFile(); url != "" && strings.HasPrefix(req.ClassIdentifier(), "HTTPClient") {
		// UEFI HTTP boot (EDK2's HttpBootDxe) takes an offer that says
		// "HTTPClient" as its vendor class, with the URI as boot file.
		resp.BootFileName = url
		resp.UpdateOption(dhcpv4.OptBootFileName(url))
		resp.UpdateOption(dhcpv4.OptClassIdentifier("HTTPClient"))
	}
	// Broadcast at both layers: the client has no address yet, and only
	// the requesting port receives it anyway.
	f := udpFrame(broadcastMAC, s.mac, s.addr, netip.AddrFrom4([4]byte{255, 255, 255, 255}), 67, 68, resp.ToBytes())
	enqueue(in, f)
}

// lease returns the address for mac: the port's reserved one, or for a MAC
// that is not a port's (a guest that changed its MAC) the next free one,
// allocated the first time so that a node keeps its address across DHCP
// renewals and reboots.
func (s *Switch) lease(mac net.HardwareAddr) (netip.Addr, bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	key := mac.String()
	if a, ok := s.leases[key]; ok {
		return a, true
	}
	a, ok := s.reserved[key]
	if !ok {
		if a, ok = s.allocLocked(); !ok {
			return netip.Addr{}, false
		}
	}
	s.leases[key] = a
	return a, true
}

// allocLocked takes the next free address.
func (s *Switch) allocLocked() (netip.Addr, bool) {
	a := s.next
	// The last address of the subnet is its broadcast address.
	if !s.subnet.Contains(a.Next()) {
		return netip.Addr{}, false
	}
	s.next = a.Next()
	return a, true
}

var broadcastMAC = net.HardwareAddr{0xff, 0xff, 0xff, 0xff, 0xff, 0xff}

// udpFrame builds an Ethernet/IPv4/UDP frame. The UDP checksum is left 0,
// which IPv4 defines as "not computed"; the IPv4 header checksum is
// mandatory and filled in.
func udpFrame(dstMAC, srcMAC net.HardwareAddr, src, dst netip.Addr, sport, dport uint16, payload []byte) []byte {
	f := make([]byte, 14+20+8+len(payload))
	copy(f[0:6], dstMAC)
	copy(f[6:12], srcMAC)
	binary.BigEndian.PutUint16(f[12:14], 0x0800)
	ip := f[14:34]
	ip[0] = 0x45
	binary.BigEndian.PutUint16(ip[2:4], uint16(20+8+len(payload)))
	ip[8] = 64 // TTL
	ip[9] = 17 // UDP
	s4, d4 := src.As4(), dst.As4()
	copy(ip[12:16], s4[:])
	copy(ip[16:20], d4[:])
	binary.BigEndian.PutUint16(ip[10:12], ipChecksum(ip))
	udp := f[34:]
	binary.BigEndian.PutUint16(udp[0:2], sport)
	binary.BigEndian.PutUint16(udp[2:4], dport)
	binary.BigEndian.PutUint16(udp[4:6], uint16(8+len(payload)))
	copy(udp[8:], payload)
	return f
}

func ipChecksum(h []byte) uint16 {
	var sum uint32
	for i := 0; i+1 < len(h); i += 2 {
		sum += uint32(binary.BigEndian.Uint16(h[i:]))
	}
	for sum>>16 != 0 {
		sum = sum&0xffff + sum>>16
	}
	return ^uint16(sum)
}

// Observe hands every frame entering the switch from now on to f, with
// the name of the port it came from (a capture: f must not keep frame,
// and runs on the switch's path, so it must be quick). A nil f stops it.
func (s *Switch) Observe(f func(port string, frame []byte)) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.observe = f
}

// SetBootFile makes the DHCP server offer url as the boot file (a UEFI
// HTTP boot URI), "" for none. Plinth's own DHCP client ignores it.
func (s *Switch) SetBootFile(url string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.bootFile = url
}

// BootFile returns what SetBootFile set.
func (s *Switch) BootFile() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.bootFile
}
