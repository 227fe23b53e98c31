package network

// These tests run the real service against the real kernel, isolated in
// network namespaces:
//
//	server netns                      node netns (+ own UTS namespace)
//	┌──────────────────────────┐      ┌───────────────────────────────┐
//	│ srv0 192.0.2.1/24        │ veth │ eth0 (configured by Service)  │
//	│ in-process DHCPv4 server ├──────┤ test binary re-exec'd as the  │
//	│ (server4, this process)  │      │ "node": supervisor + Service  │
//	└──────────────────────────┘      └───────────────────────────────┘
//
// The node side is a child process started with `ip netns exec`, so every
// thread of it is in the namespace (goroutines migrate between threads),
// and in a new UTS namespace, so that setting the hostname does not rename
// the machine running the tests. The parent reads the node's addresses and
// routes back through a netlink handle opened in the node namespace.

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"net"
	"net/netip"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"runtime"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/insomniacslk/dhcp/dhcpv4"
	"github.com/insomniacslk/dhcp/dhcpv4/server4"
	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"

	"plinth.dev/plinth/platform/logtree"
	"plinth.dev/plinth/platform/supervisor"
)

const childEnv = "PLINTH_NETWORK_TEST_NODE"

// childSpec is what the parent asks the node process to run.
type childSpec struct {
	Config      Config
	LinkWait    time.Duration
	DHCPTimeout time.Duration
	DHCPRetries int
}

// childReport is printed by the node once it has an address.
type childReport struct {
	Status         Status
	KernelHostname string
	Healthy        bool
}

func TestMain(m *testing.M) {
	if spec := os.Getenv(childEnv); spec != "" {
		os.Exit(nodeMain(spec))
	}
	removeStaleNamespaces()
	os.Exit(m.Run())
}

// removeStaleNamespaces deletes namespaces left by a test binary that was
// killed before its cleanups ran (a go test timeout does that).
func removeStaleNamespaces() {
	ents, _ := os.ReadDir("/run/netns")
	for _, e := range ents {
		var pid, seq int
		var side string
		if n, _ := fmt.Sscanf(e.Name(), "plnet%d-%d%s", &pid, &seq, &side); n != 3 {
			continue
		}
		if _, err := os.Stat(fmt.Sprintf("/proc/%d", pid)); err == nil {
			continue // its test binary still runs
		}
		_ = exec.Command("ip", "netns", "del", e.Name()).Run()
	}
}

// nodeMain runs the service as the node's PID 1 would: under a supervisor,
// logging into a logtree whose console is stdout.
func nodeMain(js string) int {
	var spec childSpec
	if err := json.Unmarshal([]byte(js), &spec); err != nil {
		fmt.Fprintln(os.Stderr, "bad spec:", err)
		return 2
	}
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, os.Interrupt)
	defer stop()
	lt := logtree.New(0)
	lt.SetLevel(slog.LevelDebug) // DHCP packet traces help when a test fails
	lt.AddSink(os.Stdout, nil)

	svc := New(spec.Config)
	if spec.LinkWait > 0 {
		svc.linkWait = spec.LinkWait
	}
	if spec.DHCPTimeout > 0 {
		svc.dhcpTimeout = spec.DHCPTimeout
	}
	if spec.DHCPRetries > 0 {
		svc.dhcpRetries = spec.DHCPRetries
	}
	sup := supervisor.New(ctx, lt, func(ctx context.Context) error {
		if err := supervisor.Run(ctx, "network", svc.Run); err != nil {
			return err
		}
		supervisor.Signal(ctx, supervisor.SignalHealthy)
		<-ctx.Done()
		return ctx.Err()
	}, supervisor.Options{InitialBackoff: time.Second})

	go func() {
		st, err := svc.WaitAddress(ctx)
		if err != nil {
			return
		}
		hctx, cancel := context.WithTimeout(ctx, 5*time.Second)
		defer cancel()
		healthy := sup.WaitHealthy(hctx) == nil
		hn, _ := os.Hostname()
		b, _ := json.Marshal(childReport{Status: st, KernelHostname: hn, Healthy: healthy})
		fmt.Printf("REPORT %s\n", b)
	}()

	<-ctx.Done()
	start := time.Now()
	sup.Wait()
	fmt.Printf("STOPPED after %s\n", time.Since(start))
	return 0
}

func requireRoot(t *testing.T) {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Fatal("needs root for network namespaces (make test runs as root in CI)")
	}
	if _, err := exec.LookPath("ip"); err != nil {
		t.Fatal("needs iproute2 (scripts/install-deps installs it)")
	}
}

func ipCmd(t *testing.T, args ...string) {
	t.Helper()
	if out, err := exec.Command("ip", args...).CombinedOutput(); err != nil {
		t.Fatalf("ip %s: %v\n%s", strings.Join(args, " "), err, out)
	}
}

var nsSeq atomic.Int32

// testNet is a node namespace and a server namespace, joined by a veth pair
// (node "eth0", server "srv0" with 192.0.2.1/24) unless withLink is false.
type testNet struct{ node, server string }

func newTestNet(t *testing.T, mac string, withLink bool) *testNet {
	t.Helper()
	id := fmt.Sprintf("plnet%d-%d", os.Getpid(), nsSeq.Add(1))
	n := &testNet{node: id + "n", server: id + "s"}
	// Registered first, so a half-built setup is removed too; deleting a
	// namespace deletes the veth end inside it, and with it the pair.
	t.Cleanup(func() {
		for _, ns := range []string{n.node, n.server} {
			_ = exec.Command("ip", "netns", "del", ns).Run()
		}
	})
	ipCmd(t, "netns", "add", n.node)
	ipCmd(t, "netns", "add", n.server)
	if withLink {
		ipCmd(t, "-n", n.node, "link", "add", "eth0", "address", mac, "type", "veth", "peer", "name", "srv0", "netns", n.server)
		ipCmd(t, "-n", n.server, "link", "set", "lo", "up")
		ipCmd(t, "-n", n.server, "addr", "add", "192.0.2.1/24", "dev", "srv0")
		ipCmd(t, "-n", n.server, "link", "set", "srv0", "up")
	}
	return n
}

var (
	srvIP = net.IPv4(192, 0, 2, 1).To4()
	dnsIP = net.IPv4(192, 0, 2, 53).To4()
)

// How the test server behaves.
const (
	serveAll       = iota
	ignoreRenewals // answers DISCOVER and SELECTING requests only
	silent         // answers nothing, as if it was gone
)

// testDHCP is a minimal DHCPv4 server handing out one address.
type testDHCP struct {
	mu       sync.Mutex
	mode     int
	offer    net.IP
	lease    time.Duration
	acks     int
	renewals int
	naks     int
	hostname string
}

func (d *testDHCP) set(offer net.IP) {
	d.mu.Lock()
	d.offer = offer.To4()
	d.mu.Unlock()
}

func (d *testDHCP) setMode(m int) {
	d.mu.Lock()
	d.mode = m
	d.mu.Unlock()
}

func (d *testDHCP) counts() (acks, renewals, naks int, hostname string) {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.acks, d.renewals, d.naks, d.hostname
}

func (d *testDHCP) handle(conn net.PacketConn, peer net.Addr, m *dhcpv4.DHCPv4) {
	if m.OpCode != dhcpv4.OpcodeBootRequest {
		return
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.mode == silent || d.mode == ignoreRenewals && m.RequestedIPAddress() == nil {
		return
	}
	d.hostname = m.HostName()
	mods := []dhcpv4.Modifier{dhcpv4.WithOption(dhcpv4.OptServerIdentifier(srvIP))}
	lease := []dhcpv4.Modifier{
		dhcpv4.WithYourIP(d.offer),
		dhcpv4.WithNetmask(net.CIDRMask(24, 32)),
		dhcpv4.WithRouter(srvIP),
		dhcpv4.WithDNS(dnsIP),
		dhcpv4.WithDomainSearchList("plinth.test"),
		dhcpv4.WithOption(dhcpv4.OptIPAddressLeaseTime(d.lease)),
	}
	switch m.MessageType() {
	case dhcpv4.MessageTypeDiscover:
		mods = append(append(mods, lease...), dhcpv4.WithMessageType(dhcpv4.MessageTypeOffer))
	case dhcpv4.MessageTypeRequest:
		want, renewal := m.RequestedIPAddress(), false
		if want == nil {
			want, renewal = m.ClientIPAddr, true
		}
		if !want.Equal(d.offer) {
			d.naks++
			mods = append(mods, dhcpv4.WithMessageType(dhcpv4.MessageTypeNak))
			break
		}
		d.acks++
		if renewal {
			d.renewals++
		}
		mods = append(append(mods, lease...), dhcpv4.WithMessageType(dhcpv4.MessageTypeAck))
	default:
		return
	}
	resp, err := dhcpv4.NewReplyFromRequest(m, mods...)
	if err != nil {
		return
	}
	_, _ = conn.WriteTo(resp.ToBytes(), peer)
}

// startDHCP serves d on srv0 in the server namespace. Only the socket has to
// be made inside the namespace; it stays there whatever thread uses it.
func startDHCP(t *testing.T, ns string, d *testDHCP) {
	t.Helper()
	type result struct {
		srv *server4.Server
		err error
	}
	ch := make(chan result, 1)
	go func() {
		// Never unlocked: the thread, left in the other namespace, is
		// discarded when this goroutine ends.
		runtime.LockOSThread()
		h, err := netns.GetFromName(ns)
		if err != nil {
			ch <- result{err: err}
			return
		}
		defer h.Close()
		if err := netns.Set(h); err != nil {
			ch <- result{err: err}
			return
		}
		srv, err := server4.NewServer("srv0", &net.UDPAddr{Port: dhcpv4.ServerPort}, d.handle)
		ch <- result{srv, err}
	}()
	r := <-ch
	if r.err != nil {
		t.Fatalf("DHCP server: %v", r.err)
	}
	go func() { _ = r.srv.Serve() }()
	t.Cleanup(func() { _ = r.srv.Close() })
}

// nodeProc is the running node process and what it printed.
type nodeProc struct {
	t      *testing.T
	cmd    *exec.Cmd
	stderr strings.Builder // guarded by mu
	mu     sync.Mutex
	lines  []string
	more   chan struct{} // closed and replaced on every new line
	exited chan struct{}
}

func startNode(t *testing.T, ns string, spec childSpec) *nodeProc {
	t.Helper()
	self, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	js, err := json.Marshal(spec)
	if err != nil {
		t.Fatal(err)
	}
	p := &nodeProc{t: t, more: make(chan struct{}), exited: make(chan struct{})}
	p.cmd = exec.Command("ip", "netns", "exec", ns, self, "-test.run=^$")
	p.cmd.Env = append(os.Environ(), childEnv+"="+string(js))
	p.cmd.SysProcAttr = &syscall.SysProcAttr{Cloneflags: syscall.CLONE_NEWUTS, Pdeathsig: syscall.SIGKILL}
	stdout, err := p.cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	stderr, err := p.cmd.StderrPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := p.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	var readers sync.WaitGroup
	readers.Add(2)
	go func() {
		defer readers.Done()
		sc := bufio.NewScanner(stdout)
		for sc.Scan() {
			p.mu.Lock()
			p.lines = append(p.lines, sc.Text())
			close(p.more)
			p.more = make(chan struct{})
			p.mu.Unlock()
		}
	}()
	go func() {
		defer readers.Done()
		sc := bufio.NewScanner(stderr)
		for sc.Scan() {
			p.mu.Lock()
			p.stderr.WriteString(sc.Text() + "\n")
			p.mu.Unlock()
		}
	}()
	go func() {
		readers.Wait() // Wait closes the pipes: read them to the end first
		_ = p.cmd.Wait()
		close(p.exited)
	}()
	t.Cleanup(func() {
		select {
		case <-p.exited:
		default:
			_ = p.cmd.Process.Kill()
			<-p.exited
		}
		if t.Failed() {
			p.mu.Lock()
			t.Logf("node output:\n%s\nnode stderr:\n%s", strings.Join(p.lines, "\n"), p.stderr.String())
			p.mu.Unlock()
		}
	})
	return p
}

// waitLine returns the first line containing all of subs.
func (p *nodeProc) waitLine(timeout time.Duration, subs ...string) string {
	p.t.Helper()
	deadline := time.After(timeout)
	for {
		p.mu.Lock()
		for _, l := range p.lines {
			if containsAll(l, subs) {
				p.mu.Unlock()
				return l
			}
		}
		more := p.more
		p.mu.Unlock()
		select {
		case <-more:
		case <-p.exited:
			p.t.Fatalf("node exited before printing a line with %q", subs)
		case <-deadline:
			p.t.Fatalf("no line with %q within %s", subs, timeout)
		}
	}
}

func containsAll(s string, subs []string) bool {
	for _, sub := range subs {
		if !strings.Contains(s, sub) {
			return false
		}
	}
	return true
}

func (p *nodeProc) report(timeout time.Duration) childReport {
	p.t.Helper()
	line := p.waitLine(timeout, "REPORT ")
	var r childReport
	if err := json.Unmarshal([]byte(strings.TrimPrefix(line, "REPORT ")), &r); err != nil {
		p.t.Fatalf("bad report %q: %v", line, err)
	}
	return r
}

// stop asks the node to shut down as at power-off and checks the service
// returned promptly.
func (p *nodeProc) stop() {
	p.t.Helper()
	if err := p.cmd.Process.Signal(syscall.SIGTERM); err != nil {
		p.t.Fatal(err)
	}
	select {
	case <-p.exited:
	case <-time.After(5 * time.Second):
		p.t.Fatal("node did not stop within 5s of SIGTERM")
	}
	line := p.waitLine(time.Second, "STOPPED after ")
	d, err := time.ParseDuration(strings.TrimPrefix(line, "STOPPED after "))
	if err != nil || d > 2*time.Second {
		p.t.Errorf("service took %q to return after cancellation", line)
	}
	if code := p.cmd.ProcessState.ExitCode(); code != 0 {
		p.t.Errorf("node exit code %d", code)
	}
}

// kernelState reads eth0's IPv4 addresses and default gateways in ns.
func kernelState(t *testing.T, ns string) (addrs []string, gateways []string) {
	t.Helper()
	h, err := netns.GetFromName(ns)
	if err != nil {
		t.Fatal(err)
	}
	defer h.Close()
	nh, err := netlink.NewHandleAt(h)
	if err != nil {
		t.Fatal(err)
	}
	defer nh.Close()
	link, err := nh.LinkByName("eth0")
	if err != nil {
		t.Fatal(err)
	}
	if link.Attrs().Flags&net.FlagUp == 0 {
		t.Error("eth0 is not up")
	}
	as, err := nh.AddrList(link, netlink.FAMILY_V4)
	if err != nil {
		t.Fatal(err)
	}
	for _, a := range as {
		addrs = append(addrs, a.IPNet.String())
	}
	rs, err := nh.RouteList(link, netlink.FAMILY_V4)
	if err != nil {
		t.Fatal(err)
	}
	for _, r := range rs {
		if r.Gw != nil && (r.Dst == nil || r.Dst.String() == "0.0.0.0/0") {
			gateways = append(gateways, r.Gw.String())
		}
	}
	lo, err := nh.LinkByName("lo")
	if err != nil {
		t.Fatal(err)
	}
	if lo.Attrs().Flags&net.FlagUp == 0 {
		t.Error("lo is not up")
	}
	return addrs, gateways
}

func readFile(t *testing.T, path string) string {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

// paths makes the node's /etc in a temporary directory, with resolv.conf a
// symlink into a directory that does not exist yet, as on the node.
func paths(t *testing.T) (dir, resolv, hostname string) {
	dir = t.TempDir()
	if err := os.MkdirAll(filepath.Join(dir, "etc"), 0o755); err != nil {
		t.Fatal(err)
	}
	resolv = filepath.Join(dir, "etc", "resolv.conf")
	if err := os.Symlink("../run/resolv.conf", resolv); err != nil {
		t.Fatal(err)
	}
	return dir, resolv, filepath.Join(dir, "etc", "hostname")
}

func TestDHCPLeaseRenewalAndChange(t *testing.T) {
	requireRoot(t)
	n := newTestNet(t, "02:00:00:12:34:56", true)
	d := &testDHCP{offer: net.IPv4(192, 0, 2, 10).To4(), lease: 4 * time.Second}
	startDHCP(t, n.server, d)
	dir, resolv, hostname := paths(t)
	p := startNode(t, n.node, childSpec{Config: Config{ResolvConfPath: resolv, HostnamePath: hostname}})

	r := p.report(15 * time.Second)
	want := Status{
		Interface: "eth0",
		Address:   netip.MustParsePrefix("192.0.2.10/24"),
		Gateway:   netip.MustParseAddr("192.0.2.1"),
		DNS:       []netip.Addr{netip.MustParseAddr("192.0.2.53")},
		Hostname:  "plinth-123456",
		Source:    "dhcp",
	}
	if r.Status.Interface != want.Interface || r.Status.Address != want.Address || r.Status.Gateway != want.Gateway ||
		!slices.Equal(r.Status.DNS, want.DNS) || r.Status.Hostname != want.Hostname || r.Status.Source != want.Source {
		t.Errorf("status = %+v\nwant     %+v", r.Status, want)
	}
	if r.KernelHostname != "plinth-123456" {
		t.Errorf("kernel hostname %q", r.KernelHostname)
	}
	if !r.Healthy {
		t.Error("supervisor tree not healthy after the address was configured")
	}
	line := p.waitLine(time.Second, "configured address")
	for _, sub := range []string{" I root.network: ", "address=192.0.2.10/24", "interface=eth0", "gateway=192.0.2.1", "dns=192.0.2.53", "lease=4s"} {
		if !strings.Contains(line, sub) {
			t.Errorf("log line %q lacks %q", line, sub)
		}
	}
	addrs, gws := kernelState(t, n.node)
	if !slices.Contains(addrs, "192.0.2.10/24") {
		t.Errorf("eth0 addresses %v, want 192.0.2.10/24", addrs)
	}
	if !slices.Equal(gws, []string{"192.0.2.1"}) {
		t.Errorf("default gateways %v, want [192.0.2.1]", gws)
	}
	rc := readFile(t, filepath.Join(dir, "run", "resolv.conf"))
	if !strings.Contains(rc, "nameserver 192.0.2.53\n") || !strings.Contains(rc, "search plinth.test\n") {
		t.Errorf("resolv.conf:\n%s", rc)
	}
	if fi, err := os.Lstat(resolv); err != nil || fi.Mode()&os.ModeSymlink == 0 {
		t.Error("resolv.conf symlink was replaced by a file")
	}
	if got := readFile(t, hostname); got != "plinth-123456\n" {
		t.Errorf("hostname file %q", got)
	}

	// T1 is 2 s after the lease: the renewal must come well within 6 s.
	p.waitLine(6*time.Second, "renewed lease", "address=192.0.2.10/24")
	if _, renewals, _, host := d.counts(); renewals < 1 || host != "plinth-123456" {
		t.Errorf("server saw %d renewals, hostname option %q", renewals, host)
	}

	// The server now refuses the old address: the next renewal is NAKed,
	// the client starts over and moves to the new address.
	d.set(net.IPv4(192, 0, 2, 11))
	p.waitLine(8*time.Second, "configured address", "address=192.0.2.11/24")
	addrs, gws = kernelState(t, n.node)
	if !slices.Contains(addrs, "192.0.2.11/24") || slices.Contains(addrs, "192.0.2.10/24") {
		t.Errorf("eth0 addresses after the change %v, want 192.0.2.11/24 only", addrs)
	}
	if !slices.Equal(gws, []string{"192.0.2.1"}) {
		t.Errorf("default gateways after the change %v", gws)
	}
	if _, _, naks, _ := d.counts(); naks < 1 {
		t.Error("server never sent a NAK")
	}

	p.stop()
	p.mu.Lock()
	if p.stderr.Len() > 0 {
		t.Errorf("node wrote to stderr (the console):\n%s", p.stderr.String())
	}
	p.mu.Unlock()
}

func TestStaticConfig(t *testing.T) {
	requireRoot(t)
	n := newTestNet(t, "02:00:00:aa:bb:cc", true)
	dir, resolv, hostname := paths(t)
	p := startNode(t, n.node, childSpec{Config: Config{
		Hostname:       "node-a",
		ResolvConfPath: resolv,
		HostnamePath:   hostname,
		Static: &Static{
			Address: netip.MustParsePrefix("192.0.2.20/24"),
			Gateway: netip.MustParseAddr("192.0.2.1"),
			DNS:     []netip.Addr{netip.MustParseAddr("192.0.2.53"), netip.MustParseAddr("192.0.2.54")},
		},
	}})
	r := p.report(10 * time.Second)
	if r.Status.Address != netip.MustParsePrefix("192.0.2.20/24") || r.Status.Source != "static" ||
		r.Status.Hostname != "node-a" || r.KernelHostname != "node-a" || !r.Healthy {
		t.Errorf("report = %+v", r)
	}
	p.waitLine(time.Second, "configured address", "address=192.0.2.20/24", "source=static")
	addrs, gws := kernelState(t, n.node)
	if !slices.Equal(addrs, []string{"192.0.2.20/24"}) || !slices.Equal(gws, []string{"192.0.2.1"}) {
		t.Errorf("eth0 addresses %v, gateways %v", addrs, gws)
	}
	rc := readFile(t, filepath.Join(dir, "run", "resolv.conf"))
	if !strings.Contains(rc, "nameserver 192.0.2.53\nnameserver 192.0.2.54\n") {
		t.Errorf("resolv.conf:\n%s", rc)
	}
	if got := readFile(t, hostname); got != "node-a\n" {
		t.Errorf("hostname file %q", got)
	}
	p.stop()
}

func TestNoLinkFails(t *testing.T) {
	requireRoot(t)
	n := newTestNet(t, "", false)
	_, resolv, hostname := paths(t)
	p := startNode(t, n.node, childSpec{
		Config:   Config{ResolvConfPath: resolv, HostnamePath: hostname},
		LinkWait: 200 * time.Millisecond,
	})
	p.waitLine(5*time.Second, "E root.network: runnable failed", "no ethernet link found")
	p.stop()
}

func TestDHCPTimeoutFails(t *testing.T) {
	requireRoot(t)
	n := newTestNet(t, "02:00:00:00:00:01", true) // no DHCP server
	_, resolv, hostname := paths(t)
	p := startNode(t, n.node, childSpec{
		Config:      Config{ResolvConfPath: resolv, HostnamePath: hostname},
		DHCPTimeout: 200 * time.Millisecond,
		DHCPRetries: 2,
	})
	p.waitLine(5*time.Second, "E root.network: runnable failed", "DHCPv4 on eth0: no offer")
	p.stop()
}

func TestDHCPRebindAndExpiry(t *testing.T) {
	requireRoot(t)
	n := newTestNet(t, "02:00:00:00:00:02", true)
	d := &testDHCP{offer: net.IPv4(192, 0, 2, 10).To4(), lease: 4 * time.Second}
	startDHCP(t, n.server, d)
	_, resolv, hostname := paths(t)
	p := startNode(t, n.node, childSpec{Config: Config{ResolvConfPath: resolv, HostnamePath: hostname}})
	p.report(15 * time.Second)

	// Renewals go unanswered until T2 (3.5 s); from then on the client asks
	// any server for its address again and gets it.
	d.setMode(ignoreRenewals)
	p.waitLine(6*time.Second, "lease renewal failed, requesting a new lease")
	p.waitLine(2*time.Second, "renewed lease", "address=192.0.2.10/24")

	// Now nothing answers: when the lease expires the address goes, and
	// the run fails for the supervisor to start over.
	d.setMode(silent)
	p.waitLine(8*time.Second, "E root.network: runnable failed", "DHCPv4 lease of 192.0.2.10/24 on eth0 expired")
	addrs, gws := kernelState(t, n.node)
	if slices.Contains(addrs, "192.0.2.10/24") || len(gws) != 0 {
		t.Errorf("after expiry eth0 still has addresses %v, gateways %v", addrs, gws)
	}
	p.stop()
}
