package network

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/netip"
	"slices"
	"time"

	"github.com/insomniacslk/dhcp/dhcpv4"
	"github.com/insomniacslk/dhcp/dhcpv4/nclient4"

	"plinth.dev/plinth/platform/supervisor"
)

// retryFloor is RFC 2131's lower bound between retries while renewing or
// rebinding (section 4.4.5): half the remaining time, but at least this.
const retryFloor = 60 * time.Second

// lease is a parsed DHCP lease.
type lease struct {
	raw      *nclient4.Lease
	cfg      netConfig
	duration time.Duration
	t1, t2   time.Duration
	obtained time.Time
}

func (l *lease) renewAt() time.Time  { return l.obtained.Add(l.t1) }
func (l *lease) rebindAt() time.Time { return l.obtained.Add(l.t2) }
func (l *lease) expiry() time.Time   { return l.obtained.Add(l.duration) }

func (s *Service) runDHCP(ctx context.Context, log *slog.Logger, n nic, hostname string) error {
	d := &dhcpClient{s: s, log: log, nic: n, hostname: hostname}
	raw, err := d.acquire(ctx, netip.Addr{})
	if err != nil {
		if ctx.Err() != nil {
			return ctx.Err()
		}
		return fmt.Errorf("DHCPv4 on %s: %w", n.name, err)
	}
	cur, err := parseLease(raw)
	if err != nil {
		return fmt.Errorf("DHCPv4 on %s: %w", n.name, err)
	}
	if _, err := s.apply(n, cur.cfg, hostname, "dhcp"); err != nil {
		return err
	}
	log.Info("configured address", append(configAttrs(n, cur.cfg, "dhcp"), "lease", cur.duration)...)
	supervisor.Signal(ctx, supervisor.SignalHealthy)

	for {
		if err := sleepUntil(ctx, cur.renewAt()); err != nil {
			return err
		}
		next, err := d.keep(ctx, cur)
		if err != nil {
			if ctx.Err() != nil {
				return ctx.Err()
			}
			s.unconfigure()
			return fmt.Errorf("DHCPv4 lease of %s on %s expired: %w", cur.cfg.Address, n.name, err)
		}
		changed, err := s.apply(n, next.cfg, hostname, "dhcp")
		if err != nil {
			return err
		}
		if changed {
			log.Info("configured address", append(configAttrs(n, next.cfg, "dhcp"), "lease", next.duration)...)
		}
		log.Info("renewed lease", "interface", n.name, "address", next.cfg.Address.String(), "lease", next.duration)
		cur = next
	}
}

// keep renews cur from T1 on, and when the server does not answer until T2
// (or refuses), asks any server for a lease from scratch until cur expires.
func (d *dhcpClient) keep(ctx context.Context, cur *lease) (*lease, error) {
	raw, err := d.retryUntil(ctx, "renew", cur.rebindAt(), func(ctx context.Context) (*nclient4.Lease, error) {
		return d.renew(ctx, cur.raw)
	})
	if err != nil {
		if ctx.Err() != nil {
			return nil, ctx.Err()
		}
		want := cur.cfg.Address.Addr()
		var nak *nclient4.ErrNak
		if errors.As(err, &nak) {
			// The server says our address is no longer ours: asking for
			// it again would only be refused again.
			want = netip.Addr{}
		}
		d.log.Warn("lease renewal failed, requesting a new lease", "interface", d.nic.name, "err", err)
		raw, err = d.retryUntil(ctx, "rebind", cur.expiry(), func(ctx context.Context) (*nclient4.Lease, error) {
			return d.acquire(ctx, want)
		})
		if err != nil {
			return nil, err
		}
	}
	return parseLease(raw)
}

type dhcpClient struct {
	s        *Service
	log      *slog.Logger
	nic      nic
	hostname string
}

// retryUntil calls fn until it succeeds, is refused, or deadline passes.
func (d *dhcpClient) retryUntil(ctx context.Context, what string, deadline time.Time, fn func(context.Context) (*nclient4.Lease, error)) (*nclient4.Lease, error) {
	dctx, cancel := context.WithDeadline(ctx, deadline)
	defer cancel()
	for {
		l, err := fn(dctx)
		if err == nil {
			return l, nil
		}
		var nak *nclient4.ErrNak
		if errors.As(err, &nak) || dctx.Err() != nil {
			return nil, fmt.Errorf("%s: %w", what, err)
		}
		wait := max(time.Until(deadline)/2, retryFloor)
		d.log.Warn("DHCP "+what+" failed, retrying", "interface", d.nic.name, "err", err, "in", wait)
		if supervisor.Sleep(dctx, wait) != nil {
			return nil, fmt.Errorf("%s: %w", what, err)
		}
	}
}

// client opens the raw socket for one exchange; see the package comment.
func (d *dhcpClient) client() (*nclient4.Client, error) {
	c, err := nclient4.New(d.nic.name,
		nclient4.WithHWAddr(d.nic.mac),
		nclient4.WithTimeout(d.s.dhcpTimeout),
		nclient4.WithRetry(d.s.dhcpRetries),
		nclient4.WithLogger(clientLogger{d.log}))
	if err != nil {
		return nil, fmt.Errorf("DHCP socket on %s: %w", d.nic.name, err)
	}
	return c, nil
}

func (d *dhcpClient) modifiers() []dhcpv4.Modifier {
	return []dhcpv4.Modifier{
		dhcpv4.WithOption(dhcpv4.OptHostName(d.hostname)),
		dhcpv4.WithRequestedOptions(
			dhcpv4.OptionInterfaceMTU,
			dhcpv4.OptionDNSDomainSearchList,
			dhcpv4.OptionClasslessStaticRoute,
		),
	}
}

// acquire runs DISCOVER-OFFER-REQUEST-ACK, asking for want if it is valid.
func (d *dhcpClient) acquire(ctx context.Context, want netip.Addr) (*nclient4.Lease, error) {
	c, err := d.client()
	if err != nil {
		return nil, err
	}
	defer c.Close()
	mods := d.modifiers()
	discover := mods
	if want.IsValid() {
		// Only in the DISCOVER: the REQUEST must name what was offered.
		discover = append(slices.Clip(mods), dhcpv4.WithOption(dhcpv4.OptRequestedIPAddress(want.AsSlice())))
	}
	offer, err := c.DiscoverOffer(ctx, discover...)
	if err != nil {
		return nil, fmt.Errorf("no offer: %w", err)
	}
	l, err := c.RequestFromOffer(ctx, offer, mods...)
	if err != nil {
		return nil, fmt.Errorf("request for offered %s from %s: %w", offer.YourIPAddr, offer.ServerIdentifier(), err)
	}
	return l, nil
}

func (d *dhcpClient) renew(ctx context.Context, l *nclient4.Lease) (*nclient4.Lease, error) {
	c, err := d.client()
	if err != nil {
		return nil, err
	}
	defer c.Close()
	return c.Renew(ctx, l, d.modifiers()...)
}

// parseLease turns an ACK into the configuration it asks for.
func parseLease(l *nclient4.Lease) (*lease, error) {
	ack := l.ACK
	ip, ok := netip.AddrFromSlice(ack.YourIPAddr.To4())
	if !ok || ip.IsUnspecified() {
		return nil, fmt.Errorf("ACK from %s carries no address", ack.ServerIdentifier())
	}
	mask := ack.SubnetMask()
	if mask == nil {
		mask = net.IP(ip.AsSlice()).DefaultMask()
	}
	ones, bits := mask.Size()
	if bits != 32 {
		return nil, fmt.Errorf("ACK from %s has an invalid subnet mask %s", ack.ServerIdentifier(), mask)
	}
	cfg := netConfig{Address: netip.PrefixFrom(ip, ones)}

	// RFC 3442: with classless routes the router option is to be ignored.
	if crs := ack.ClasslessStaticRoute(); len(crs) > 0 {
		for _, r := range crs {
			dst, err := ipNetPrefix(r.Dest)
			if err != nil {
				continue
			}
			gw, _ := netip.AddrFromSlice(r.Router.To4())
			cfg.Routes = append(cfg.Routes, route{Dst: dst, Gw: gw})
			if dst.Bits() == 0 && gw.IsValid() && !gw.IsUnspecified() {
				cfg.Gateway = gw
			}
		}
	} else if rs := ack.Router(); len(rs) > 0 {
		if gw, ok := netip.AddrFromSlice(rs[0].To4()); ok && !gw.IsUnspecified() {
			cfg.Gateway = gw
			cfg.Routes = []route{{Dst: defaultDst(gw), Gw: gw}}
		}
	}
	for _, d := range ack.DNS() {
		if a, ok := netip.AddrFromSlice(d.To4()); ok {
			cfg.DNS = append(cfg.DNS, a)
		}
	}
	if ds := ack.DomainSearch(); ds != nil && len(ds.Labels) > 0 {
		cfg.Search = slices.Clone(ds.Labels)
	} else if dn := ack.DomainName(); dn != "" {
		cfg.Search = []string{dn}
	}
	if mtu, err := dhcpv4.GetUint16(dhcpv4.OptionInterfaceMTU, ack.Options); err == nil {
		cfg.MTU = int(mtu)
	}

	dur := ack.IPAddressLeaseTime(0)
	if dur <= 0 {
		// An ACK must carry a lease time; an hour is what a server that
		// forgot it most likely means, and renewing early is harmless.
		dur = time.Hour
	}
	t1 := ack.IPAddressRenewalTime(0)
	if t1 <= 0 || t1 >= dur {
		t1 = dur / 2
	}
	t2 := ack.IPAddressRebindingTime(0)
	if t2 <= t1 || t2 >= dur {
		t2 = max(t1, dur*7/8)
	}
	obtained := l.CreationTime
	if obtained.IsZero() {
		obtained = time.Now()
	}
	return &lease{raw: l, cfg: cfg, duration: dur, t1: t1, t2: t2, obtained: obtained}, nil
}

func ipNetPrefix(n *net.IPNet) (netip.Prefix, error) {
	if n == nil {
		return netip.Prefix{}, errors.New("no destination")
	}
	a, ok := netip.AddrFromSlice(n.IP.To4())
	if !ok {
		return netip.Prefix{}, fmt.Errorf("bad destination %s", n)
	}
	ones, _ := n.Mask.Size()
	return netip.PrefixFrom(a, ones).Masked(), nil
}

// clientLogger sends nclient4's chatter to the supervisor logger at debug
// level: it must never reach stderr, which is the node's console.
type clientLogger struct{ l *slog.Logger }

func (c clientLogger) Printf(format string, v ...any) {
	c.l.Debug(fmt.Sprintf(format, v...))
}

func (c clientLogger) PrintMessage(prefix string, m *dhcpv4.DHCPv4) {
	c.l.Debug(prefix, "type", m.MessageType().String(), "xid", m.TransactionID.String(),
		"yiaddr", m.YourIPAddr.String(), "server", m.ServerIdentifier().String())
}
