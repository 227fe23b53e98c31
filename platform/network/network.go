// Package network brings up the node's network: loopback, the hostname, and
// an IPv4 address on the first ethernet link, either from the node
// parameters (static) or from DHCPv4, which it then keeps renewed.
//
//	Run ─► lo up (127.0.0.1/8)
//	    ─► first ethernet link (by ifindex) up ─► hostname: kernel + HostnamePath
//	    ─┬─ Static: address, default route, resolv.conf ─► healthy ─► idle
//	     └─ DHCPv4: wait for carrier ─► DISCOVER/OFFER/REQUEST/ACK
//	              ─► address, routes, resolv.conf ─► healthy
//	              ─► at T1: RENEW ─ok─► reconfigure if changed ─► again at T1
//	                   │ no answer by T2, or NAK
//	                   └─► DISCOVER again ─ok─► reconfigure if changed ─► again at T1
//	                         │ no answer by lease expiry
//	                         └─► remove address, Run fails (the supervisor restarts it)
//
// The service keeps what it applied across restarts by the supervisor, so a
// new run replaces its own old address and routes rather than piling up
// addresses, and never touches addresses that other software (a VIP
// announcer, say) put on the same link.
//
// DHCP exchanges use a raw packet socket (nclient4) that is opened only for
// the exchange: a packet socket kept open would copy every IPv4 frame of the
// node into this process.
package network

import (
	"context"
	"fmt"
	"log/slog"
	"net"
	"net/netip"
	"slices"
	"sort"
	"sync"
	"time"

	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"

	"plinth.dev/plinth/platform/supervisor"
)

// Static is an optional static configuration (from the node parameters).
type Static struct {
	Interface string       // "" = first ethernet link
	Address   netip.Prefix // e.g. 10.0.2.15/24
	Gateway   netip.Addr   // optional
	DNS       []netip.Addr
}

// Config of the network service.
type Config struct {
	// Hostname; "" derives a stable "plinth-<last 3 bytes of the MAC>".
	Hostname string
	// Static; nil runs DHCPv4 on the first ethernet link.
	Static *Static
	// ResolvConfPath defaults to /etc/resolv.conf. A symlink there is
	// followed, so the file it points to is replaced rather than the link.
	ResolvConfPath string
	// HostnamePath defaults to /etc/hostname, written like ResolvConfPath.
	HostnamePath string
}

// Status is the configuration in force, for other parts of the node.
type Status struct {
	Interface string
	Address   netip.Prefix
	Gateway   netip.Addr
	DNS       []netip.Addr
	Hostname  string
	Source    string // "dhcp" or "static"
}

// Service configures the network; Run is its supervised runnable.
type Service struct {
	c Config

	mu      sync.Mutex
	status  *Status       // nil while no address is configured
	changed chan struct{} // closed and replaced whenever status changes
	applied applied       // what this service put into the kernel

	// Tunables, only changed by tests.
	linkWait    time.Duration // how long to wait for a link to appear
	carrierWait time.Duration // how long to wait for carrier before DHCP
	dhcpTimeout time.Duration // first retransmission timeout (doubles)
	dhcpRetries int           // transmissions per DHCP step
}

// New makes a service; nothing happens until Run.
func New(c Config) *Service {
	if c.ResolvConfPath == "" {
		c.ResolvConfPath = "/etc/resolv.conf"
	}
	if c.HostnamePath == "" {
		c.HostnamePath = "/etc/hostname"
	}
	return &Service{
		c:           c,
		changed:     make(chan struct{}),
		linkWait:    10 * time.Second,
		carrierWait: 5 * time.Second,
		// 2+4+8+16 s: a DHCP step gives up after 30 s, long enough for a
		// slow server, short enough that the supervisor's restart (and its
		// log line) tells an operator something is wrong.
		dhcpTimeout: 2 * time.Second,
		dhcpRetries: 4,
	}
}

// Status returns the current configuration; false before an address is
// configured (or after a DHCP lease was lost).
func (s *Service) Status() (Status, bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.status == nil {
		return Status{}, false
	}
	return s.status.clone(), true
}

// WaitAddress blocks until an address is configured or ctx ends.
func (s *Service) WaitAddress(ctx context.Context) (Status, error) {
	for {
		s.mu.Lock()
		st, ch := s.status, s.changed
		if st != nil {
			c := st.clone()
			s.mu.Unlock()
			return c, nil
		}
		s.mu.Unlock()
		select {
		case <-ch:
		case <-ctx.Done():
			return Status{}, ctx.Err()
		}
	}
}

func (st *Status) clone() Status {
	c := *st
	c.DNS = slices.Clone(st.DNS)
	return c
}

func (s *Service) setStatus(st *Status) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.status = st
	close(s.changed)
	s.changed = make(chan struct{})
}

// Run configures the network and, with DHCP, keeps the lease. It returns an
// error when it cannot get or keep an address, so that the supervisor
// retries with backoff.
func (s *Service) Run(ctx context.Context) error {
	log := supervisor.Logger(ctx)
	if err := setupLoopback(); err != nil {
		return fmt.Errorf("loopback: %w", err)
	}
	link, err := s.findLink(ctx)
	if err != nil {
		return err
	}
	nic := nicOf(link)
	if err := netlink.LinkSetUp(link); err != nil {
		return fmt.Errorf("set %s up: %w", nic.name, err)
	}

	hostname := s.c.Hostname
	if hostname == "" {
		hostname = deriveHostname(nic.mac)
	}
	if err := unix.Sethostname([]byte(hostname)); err != nil {
		return fmt.Errorf("set hostname %q: %w", hostname, err)
	}
	if err := writeFile(s.c.HostnamePath, []byte(hostname+"\n")); err != nil {
		return fmt.Errorf("hostname file: %w", err)
	}
	log.Info("link up", "interface", nic.name, "mac", nic.mac.String(), "hostname", hostname)

	if s.c.Static != nil {
		return s.runStatic(ctx, log, nic, hostname)
	}
	if !s.waitCarrier(ctx, nic) {
		if ctx.Err() != nil {
			return ctx.Err()
		}
		// DHCP retransmits anyway; a link that reports no carrier but
		// works (some drivers never set LOWER_UP) must not be refused.
		log.Warn("no carrier yet, trying DHCP anyway", "interface", nic.name, "waited", s.carrierWait)
	}
	return s.runDHCP(ctx, log, nic, hostname)
}

func (s *Service) runStatic(ctx context.Context, log *slog.Logger, nic nic, hostname string) error {
	st := s.c.Static
	if !st.Address.IsValid() {
		return fmt.Errorf("static configuration for %s has no address", nic.name)
	}
	cfg := netConfig{Address: st.Address, Gateway: st.Gateway, DNS: slices.Clone(st.DNS)}
	if st.Gateway.IsValid() {
		cfg.Routes = []route{{Dst: defaultDst(st.Gateway), Gw: st.Gateway}}
	}
	if _, err := s.apply(nic, cfg, hostname, "static"); err != nil {
		return err
	}
	log.Info("configured address", configAttrs(nic, cfg, "static")...)
	supervisor.Signal(ctx, supervisor.SignalHealthy)
	<-ctx.Done()
	return ctx.Err()
}

// nic is the chosen link, as far as the rest of the service cares.
type nic struct {
	index int
	name  string
	mac   net.HardwareAddr
	mtu   int
}

func nicOf(l netlink.Link) nic {
	a := l.Attrs()
	return nic{index: a.Index, name: a.Name, mac: slices.Clone(a.HardwareAddr), mtu: a.MTU}
}

// deriveHostname is the hostname of a node without a configured one: stable
// across reboots and reinstalls, and unique enough within one cluster.
func deriveHostname(mac net.HardwareAddr) string {
	if len(mac) < 3 {
		return "plinth"
	}
	return fmt.Sprintf("plinth-%x", []byte(mac[len(mac)-3:]))
}

func setupLoopback() error {
	lo, err := netlink.LinkByName("lo")
	if err != nil {
		return err
	}
	if err := netlink.LinkSetUp(lo); err != nil {
		return err
	}
	// The kernel adds 127.0.0.1/8 itself when lo goes up; replacing it is
	// harmless and covers kernels or namespaces where it did not.
	return netlink.AddrReplace(lo, &netlink.Addr{
		IPNet: &net.IPNet{IP: net.IPv4(127, 0, 0, 1), Mask: net.CIDRMask(8, 32)},
		Scope: unix.RT_SCOPE_HOST,
	})
}

// findLink waits a little for the link: the driver may still be probing
// when the service starts, and failing right away would only put an error
// on the console for an ordinary boot.
func (s *Service) findLink(ctx context.Context) (netlink.Link, error) {
	deadline := time.Now().Add(s.linkWait)
	want := ""
	if s.c.Static != nil {
		want = s.c.Static.Interface
	}
	for {
		var l netlink.Link
		var err error
		if want != "" {
			l, err = netlink.LinkByName(want)
		} else {
			var links []netlink.Link
			links, err = netlink.LinkList()
			if err == nil {
				l = pickLink(links)
			}
		}
		if l != nil && err == nil {
			return l, nil
		}
		if time.Now().After(deadline) {
			if want != "" {
				return nil, fmt.Errorf("network interface %q not found: %v", want, err)
			}
			if err != nil {
				return nil, fmt.Errorf("listing network links: %w", err)
			}
			return nil, fmt.Errorf("no ethernet link found (waited %s)", s.linkWait)
		}
		if err := supervisor.Sleep(ctx, 100*time.Millisecond); err != nil {
			return nil, err
		}
	}
}

// pickLink returns the first ethernet link by ifindex. Physical NICs win
// over virtual ethernet links (veth, bridges, VXLAN): those only exist
// before this service runs if Kubernetes networking created them, e.g. when
// the supervisor restarts the service on a running node.
func pickLink(links []netlink.Link) netlink.Link {
	var cands []netlink.Link
	for _, l := range links {
		a := l.Attrs()
		if a.Flags&net.FlagLoopback != 0 || a.EncapType != "ether" || len(a.HardwareAddr) != 6 {
			continue
		}
		if slices.Equal(a.HardwareAddr, make(net.HardwareAddr, 6)) {
			continue
		}
		cands = append(cands, l)
	}
	sort.SliceStable(cands, func(i, j int) bool {
		pi, pj := cands[i].Type() == "device", cands[j].Type() == "device"
		if pi != pj {
			return pi
		}
		return cands[i].Attrs().Index < cands[j].Attrs().Index
	})
	if len(cands) == 0 {
		return nil
	}
	return cands[0]
}

// waitCarrier reports whether the link came up within carrierWait: a
// DISCOVER sent before that is lost and costs a full retransmit timeout.
func (s *Service) waitCarrier(ctx context.Context, n nic) bool {
	deadline := time.Now().Add(s.carrierWait)
	for {
		l, err := netlink.LinkByIndex(n.index)
		if err == nil && l.Attrs().RawFlags&unix.IFF_LOWER_UP != 0 {
			return true
		}
		if time.Now().After(deadline) || supervisor.Sleep(ctx, 50*time.Millisecond) != nil {
			return false
		}
	}
}

func sleepUntil(ctx context.Context, t time.Time) error {
	return supervisor.Sleep(ctx, time.Until(t))
}
