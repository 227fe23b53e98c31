package launch

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"
)

// Router gives the host access to nodes on a Switch: TCP ports on
// 127.0.0.1 forwarded to node addresses, without root.
//
//	host 127.0.0.1:P ──► qemu -machine none (no guest at all)
//	                     -netdev user (slirp: NAT, hostfwd P → node:port,
//	                          │        restrict=on, ipv6=off)
//	                     -netdev hubport ×2 (hub 0 joins the two netdevs)
//	                          │
//	                     -netdev dgram ──► switch port "router" ──► nodes
//
// The slirp stack takes the switch's own address (the nodes' default
// gateway), so it answers the nodes' ARP for it and forwarded connections
// come from there. Slirp's DHCP server would answer nodes too, so the
// switch never passes DHCP traffic to or from a router port; restrict=on
// keeps nodes from reaching the host or the internet through it.
//
// QEMU fixes hostfwd rules at start, so a Router is started with every
// forward it will need: LaunchCluster makes forwards for spare node slots
// up front. AddForwards restarts the QEMU process with more rules, keeping
// the host ports of the existing ones (connections through the router are
// cut by a restart; clients reconnect to the same ports).
type Router struct {
	sw            *Switch
	workDir       string
	local, remote string // router-side and switch-side socket paths

	mu       sync.Mutex
	forwards map[netip.AddrPort]int // guest address → host port
	toHost   []GuestForward
	cmd      *exec.Cmd
	exited   chan struct{}
	log      *os.File
	closed   bool
}

// routerStartTimeout bounds the wait for QEMU to bind the forwarded ports.
const routerStartTimeout = 30 * time.Second

// GuestForward lets nodes reach a host service: connections to Guest (an
// unused address on the switch network) go to Host ("127.0.0.1:P"), by
// slirp's guestfwd, which restrict=on leaves working. The VM tests serve
// UEFI HTTP boot this way.
type GuestForward struct {
	Guest netip.AddrPort
	Host  string
	// Cmd, if set, is spawned for each connection (split into arguments
	// as a shell would, but run without one), its standard input and
	// output being the connection, instead of Host:
	// slirp joins every guest connection to Host to one host
	// connection, made when QEMU starts, which serves one HTTP fetch
	// (network boot) but not a client that opens several (a registry's).
	Cmd string
}

// StartRouter attaches a router to sw and starts it with forwards to
// every guest address in guests. Its log (QEMU's stderr) goes to
// workDir/router.log. One router per switch.
func StartRouter(ctx context.Context, sw *Switch, workDir string, guests []netip.AddrPort, toHost ...GuestForward) (*Router, error) {
	if err := os.MkdirAll(workDir, 0o755); err != nil {
		return nil, fmt.Errorf("launch: router: %w", err)
	}
	for _, g := range guests {
		if !sw.Subnet().Contains(g.Addr()) {
			return nil, fmt.Errorf("launch: router: %v is not on the switch's network %v", g, sw.Subnet())
		}
	}
	local, remote, err := sw.routerPort("router")
	if err != nil {
		return nil, err
	}
	r := &Router{sw: sw, workDir: workDir, local: local, remote: remote, forwards: map[netip.AddrPort]int{}, toHost: toHost}
	for _, g := range guests {
		r.forwards[g] = 0
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	if err := r.startLocked(ctx); err != nil {
		return nil, err
	}
	return r, nil
}

// Endpoint returns "127.0.0.1:P", the host end of the forward to guest,
// or "" if the router has none.
func (r *Router) Endpoint(guest netip.AddrPort) string {
	r.mu.Lock()
	defer r.mu.Unlock()
	if p := r.forwards[guest]; p != 0 {
		return net.JoinHostPort("127.0.0.1", strconv.Itoa(p))
	}
	return ""
}

// AddForwards makes sure every guest address has a forward, restarting
// QEMU if any is new.
func (r *Router) AddForwards(ctx context.Context, guests []netip.AddrPort) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.closed {
		return errors.New("launch: router closed")
	}
	added := false
	for _, g := range guests {
		if !r.sw.Subnet().Contains(g.Addr()) {
			return fmt.Errorf("launch: router: %v is not on the switch's network %v", g, r.sw.Subnet())
		}
		if _, ok := r.forwards[g]; !ok {
			r.forwards[g], added = 0, true
		}
	}
	if !added {
		return nil
	}
	r.stopLocked()
	return r.startLocked(ctx)
}

// Close stops the router.
func (r *Router) Close() error {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.closed = true
	r.stopLocked()
	return nil
}

func (r *Router) stopLocked() {
	if r.cmd == nil {
		return
	}
	r.cmd.Process.Kill()
	<-r.exited
	r.log.Close()
	r.cmd = nil
}

// startLocked starts QEMU. Forwards without a host port get a free one;
// if QEMU cannot bind a port (taken by someone else since it was picked),
// every port is picked afresh and QEMU started again.
func (r *Router) startLocked(ctx context.Context) error {
	var err error
	for attempt := 0; attempt < 3; attempt++ {
		if attempt > 0 {
			for g := range r.forwards {
				r.forwards[g] = 0
			}
		}
		if err = r.pickPortsLocked(); err != nil {
			return err
		}
		if err = r.launchLocked(ctx); err == nil || ctx.Err() != nil {
			return err
		}
	}
	return err
}

func (r *Router) pickPortsLocked() error {
	var lns []net.Listener
	defer func() {
		for _, l := range lns {
			l.Close()
		}
	}()
	used := map[int]bool{}
	for _, p := range r.forwards {
		used[p] = true
	}
	for g, p := range r.forwards {
		if p != 0 {
			continue
		}
		for {
			l, err := net.Listen("tcp", "127.0.0.1:0")
			if err != nil {
				return fmt.Errorf("launch: router: picking a port: %w", err)
			}
			lns = append(lns, l)
			if p = l.Addr().(*net.TCPAddr).Port; !used[p] {
				break
			}
		}
		used[p], r.forwards[g] = true, p
	}
	return nil
}

func (r *Router) qemuArgs() []string {
	guests := make([]netip.AddrPort, 0, len(r.forwards))
	for g := range r.forwards {
		guests = append(guests, g)
	}
	slices.SortFunc(guests, func(a, b netip.AddrPort) int { return a.Compare(b) })
	user := fmt.Sprintf("user,id=u,net=%s,host=%s,ipv6=off,restrict=on", r.sw.Subnet(), r.sw.Addr())
	for _, g := range guests {
		user += fmt.Sprintf(",hostfwd=tcp:127.0.0.1:%d-%s:%d", r.forwards[g], g.Addr(), g.Port())
	}
	for _, f := range r.toHost {
		if f.Cmd != "" {
			user += fmt.Sprintf(",guestfwd=tcp:%s-cmd:%s", f.Guest, qemuOpt(f.Cmd))
		} else {
			user += fmt.Sprintf(",guestfwd=tcp:%s-tcp:%s", f.Guest, f.Host)
		}
	}
	return []string{
		"-machine", "none", "-nodefaults", "-display", "none",
		"-netdev", user,
		"-netdev", fmt.Sprintf("dgram,id=d,local.type=unix,local.path=%s,remote.type=unix,remote.path=%s", qemuOpt(r.local), qemuOpt(r.remote)),
		// A hub joins the two netdevs; QEMU warns "hub 0 with no nics",
		// which is the point here.
		"-netdev", "hubport,id=h1,hubid=0,netdev=u",
		"-netdev", "hubport,id=h2,hubid=0,netdev=d",
	}
}

func (r *Router) launchLocked(ctx context.Context) error {
	logPath := filepath.Join(r.workDir, "router.log")
	logf, err := os.OpenFile(logPath, os.O_WRONLY|os.O_CREATE|os.O_APPEND, 0o644)
	if err != nil {
		return fmt.Errorf("launch: router: %w", err)
	}
	args := r.qemuArgs()
	fmt.Fprintf(logf, "# qemu-system-x86_64 %s\n", shellJoin(args))
	cmd := exec.Command("qemu-system-x86_64", args...)
	cmd.Stdout, cmd.Stderr = logf, logf
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL, Setpgid: true}
	if err := cmd.Start(); err != nil {
		logf.Close()
		return fmt.Errorf("launch: router: starting qemu: %w", err)
	}
	exited := make(chan struct{})
	go func() { cmd.Wait(); close(exited) }()
	r.cmd, r.exited, r.log = cmd, exited, logf

	ports := make([]int, 0, len(r.forwards))
	for _, p := range r.forwards {
		ports = append(ports, p)
	}
	ctx, cancel := context.WithTimeout(ctx, routerStartTimeout)
	defer cancel()
	for {
		// Polling /proc rather than connecting: a connection would make
		// slirp open one to the guest.
		if listening(ports) {
			return nil
		}
		select {
		case <-exited:
			r.cmd = nil
			logf.Close()
			return fmt.Errorf("launch: router: qemu exited (%s)%s", cmd.ProcessState, fileTail(logPath, 5))
		case <-ctx.Done():
			r.stopLocked()
			return fmt.Errorf("launch: router: waiting for forwarded ports: %w", ctx.Err())
		case <-time.After(20 * time.Millisecond):
		}
	}
}

// listening reports whether every port is in LISTEN state on 127.0.0.1
// (by /proc/net/tcp).
func listening(ports []int) bool {
	f, err := os.Open("/proc/net/tcp")
	if err != nil {
		return false
	}
	defer f.Close()
	up := map[int]bool{}
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		fields := strings.Fields(sc.Text())
		// sl local_address rem_address st ...; 0A is LISTEN.
		if len(fields) < 4 || fields[3] != "0A" {
			continue
		}
		addr, port, ok := strings.Cut(fields[1], ":")
		if !ok || addr != "0100007F" {
			continue
		}
		if p, err := strconv.ParseUint(port, 16, 16); err == nil {
			up[int(p)] = true
		}
	}
	for _, p := range ports {
		if !up[p] {
			return false
		}
	}
	return true
}
