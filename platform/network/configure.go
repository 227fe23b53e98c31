package network

import (
	"bytes"
	"errors"
	"fmt"
	"io/fs"
	"net"
	"net/netip"
	"os"
	"path/filepath"
	"slices"
	"strings"

	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"
)

// netConfig is what one lease or static configuration asks for.
type netConfig struct {
	Address netip.Prefix
	Gateway netip.Addr // for Status and logs; routes carry the real routing
	Routes  []route
	DNS     []netip.Addr
	Search  []string
	MTU     int // 0 = leave as is
}

type route struct {
	Dst netip.Prefix
	Gw  netip.Addr // invalid = directly on the link
}

// applied is what the service put into the kernel, so that it can remove
// exactly that when the configuration changes.
type applied struct {
	link   int
	cfg    netConfig
	source string // routes are deleted by protocol, which follows the source
}

func defaultDst(gw netip.Addr) netip.Prefix {
	if gw.Is4() {
		return netip.PrefixFrom(netip.IPv4Unspecified(), 0)
	}
	return netip.PrefixFrom(netip.IPv6Unspecified(), 0)
}

func (c netConfig) equal(o netConfig) bool {
	return c.Address == o.Address && c.Gateway == o.Gateway && c.MTU == o.MTU &&
		slices.Equal(c.Routes, o.Routes) && slices.Equal(c.DNS, o.DNS) && slices.Equal(c.Search, o.Search)
}

// apply makes the kernel and resolv.conf match cfg and publishes the
// status. It reports whether anything differed from what was applied
// before.
func (s *Service) apply(n nic, cfg netConfig, hostname, source string) (bool, error) {
	s.mu.Lock()
	prev := s.applied
	s.mu.Unlock()
	changed := prev.link != n.index || prev.source != source || !prev.cfg.equal(cfg)

	link, err := netlink.LinkByIndex(n.index)
	if err != nil {
		return false, fmt.Errorf("link %s: %w", n.name, err)
	}
	if prev.cfg.Address.IsValid() && (prev.link != n.index || prev.cfg.Address != cfg.Address) {
		// Removed before the new one is added: when both share a subnet the
		// new one would be a secondary address, and the kernel deletes
		// secondaries with their primary unless promote_secondaries is on.
		if err := delAddr(prev.link, prev.cfg.Address); err != nil {
			return false, fmt.Errorf("remove old address %s: %w", prev.cfg.Address, err)
		}
	}
	if cfg.MTU >= 576 && cfg.MTU != link.Attrs().MTU {
		if err := netlink.LinkSetMTU(link, cfg.MTU); err != nil {
			return false, fmt.Errorf("set MTU %d on %s: %w", cfg.MTU, n.name, err)
		}
	}
	if err := netlink.AddrReplace(link, &netlink.Addr{IPNet: ipNet(cfg.Address)}); err != nil {
		return false, fmt.Errorf("add address %s to %s: %w", cfg.Address, n.name, err)
	}
	var stale []route
	for _, r := range prev.cfg.Routes {
		if prev.link != n.index || prev.source != source || !slices.Contains(cfg.Routes, r) {
			stale = append(stale, r)
		}
	}
	// Recorded before the routes change, so that if this fails halfway the
	// next run still removes this address and every route either
	// configuration had; deleting a route that is not there is harmless.
	pending := cfg
	if prev.link == n.index && prev.source == source {
		pending.Routes = append(slices.Clone(cfg.Routes), stale...)
	}
	s.mu.Lock()
	s.applied = applied{link: n.index, cfg: pending, source: source}
	s.mu.Unlock()
	for _, r := range cfg.Routes {
		if err := netlink.RouteReplace(s.nlRoute(n.index, cfg.Address, r, source)); err != nil {
			return false, fmt.Errorf("route %s via %s on %s: %w", r.Dst, r.Gw, n.name, err)
		}
	}
	for _, r := range stale {
		// The route may already be gone with its old address.
		_ = netlink.RouteDel(s.nlRoute(prev.link, prev.cfg.Address, r, prev.source))
	}
	s.mu.Lock()
	s.applied.cfg = cfg
	s.mu.Unlock()
	if err := writeFile(s.c.ResolvConfPath, resolvConf(cfg.DNS, cfg.Search, source, n.name)); err != nil {
		return false, fmt.Errorf("resolv.conf: %w", err)
	}
	s.setStatus(&Status{
		Interface: n.name,
		Address:   cfg.Address,
		Gateway:   cfg.Gateway,
		DNS:       slices.Clone(cfg.DNS),
		Hostname:  hostname,
		Source:    source,
	})
	return changed, nil
}

// unconfigure removes what apply added, for a lost lease: keeping an
// address whose lease expired could collide with its next holder.
func (s *Service) unconfigure() {
	s.mu.Lock()
	prev := s.applied
	s.applied = applied{}
	s.mu.Unlock()
	s.setStatus(nil)
	if !prev.cfg.Address.IsValid() {
		return
	}
	for _, r := range prev.cfg.Routes {
		_ = netlink.RouteDel(s.nlRoute(prev.link, prev.cfg.Address, r, prev.source))
	}
	_ = delAddr(prev.link, prev.cfg.Address)
}

func delAddr(index int, p netip.Prefix) error {
	link, err := netlink.LinkByIndex(index)
	if err != nil {
		// The link is gone, and its addresses with it.
		return nil
	}
	err = netlink.AddrDel(link, &netlink.Addr{IPNet: ipNet(p)})
	if errors.Is(err, unix.EADDRNOTAVAIL) || errors.Is(err, unix.ENOENT) {
		return nil
	}
	return err
}

func (s *Service) nlRoute(index int, addr netip.Prefix, r route, source string) *netlink.Route {
	nr := &netlink.Route{LinkIndex: index, Dst: ipNet(r.Dst), Protocol: unix.RTPROT_STATIC}
	if source == "dhcp" {
		nr.Protocol = unix.RTPROT_DHCP
	}
	if !r.Gw.IsValid() || r.Gw.IsUnspecified() {
		nr.Scope = netlink.SCOPE_LINK
		return nr
	}
	nr.Gw = r.Gw.AsSlice()
	if !addr.Masked().Contains(r.Gw) {
		// A gateway outside the subnet (common with /32 cloud leases) is
		// still on the link; without onlink the kernel refuses the route.
		nr.Flags = int(netlink.FLAG_ONLINK)
	}
	return nr
}

func ipNet(p netip.Prefix) *net.IPNet {
	bits := 32
	if p.Addr().Is6() {
		bits = 128
	}
	return &net.IPNet{IP: p.Addr().AsSlice(), Mask: net.CIDRMask(p.Bits(), bits)}
}

func resolvConf(dns []netip.Addr, search []string, source, iface string) []byte {
	var b bytes.Buffer
	fmt.Fprintf(&b, "# Written by the plinth network service (%s on %s).\n", source, iface)
	for _, d := range dns {
		fmt.Fprintf(&b, "nameserver %s\n", d)
	}
	if len(search) > 0 {
		fmt.Fprintf(&b, "search %s\n", strings.Join(search, " "))
	}
	return b.Bytes()
}

// writeFile replaces path atomically, so that a reader never sees half a
// resolv.conf. A symlink at path is followed first: renaming over it would
// replace the link, and on the node /etc is read-only with the links
// pointing into a writable place.
func writeFile(path string, data []byte) error {
	target, err := followLinks(path)
	if err != nil {
		return err
	}
	if old, err := os.ReadFile(target); err == nil && bytes.Equal(old, data) {
		return nil
	}
	dir := filepath.Dir(target)
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return err
	}
	f, err := os.CreateTemp(dir, "."+filepath.Base(target)+".*")
	if err != nil {
		return err
	}
	defer os.Remove(f.Name()) // no-op after the rename
	if _, err := f.Write(data); err != nil {
		f.Close()
		return err
	}
	if err := f.Chmod(0o644); err != nil {
		f.Close()
		return err
	}
	if err := f.Close(); err != nil {
		return err
	}
	return os.Rename(f.Name(), target)
}

// followLinks resolves symlinks in the last path element, also dangling
// ones: the link's target may not exist before the first write.
func followLinks(path string) (string, error) {
	p := path
	for range 16 {
		fi, err := os.Lstat(p)
		if errors.Is(err, fs.ErrNotExist) {
			return p, nil
		}
		if err != nil {
			return "", err
		}
		if fi.Mode()&fs.ModeSymlink == 0 {
			return p, nil
		}
		t, err := os.Readlink(p)
		if err != nil {
			return "", err
		}
		if !filepath.IsAbs(t) {
			t = filepath.Join(filepath.Dir(p), t)
		}
		p = t
	}
	return "", fmt.Errorf("%s: too many levels of symbolic links", path)
}

func configAttrs(n nic, cfg netConfig, source string) []any {
	gw := "none"
	if cfg.Gateway.IsValid() {
		gw = cfg.Gateway.String()
	}
	dns := make([]string, len(cfg.DNS))
	for i, d := range cfg.DNS {
		dns[i] = d.String()
	}
	return []any{
		"interface", n.name,
		"address", cfg.Address.String(),
		"gateway", gw,
		"dns", strings.Join(dns, ","),
		"source", source,
	}
}
