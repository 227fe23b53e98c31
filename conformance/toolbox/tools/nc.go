package tools

import (
	"errors"
	"fmt"
	"io"
	"net"
	"strconv"
	"strings"
	"sync/atomic"
	"time"
)

// ncOpts is the subset of OpenBSD netcat's options the e2e tests use.
type ncOpts struct {
	verbose, udp, zero, listen, keep, unix, noStdin bool
	family                                          string // "", "4" or "6"
	wait, quit                                      time.Duration
	hasQuit                                         bool
	localPort, source                               string
	args                                            []string
}

func ncMain(args []string, stdin io.Reader, stdout, stderr io.Writer) int {
	o, err := parseNCArgs(args[1:])
	if err != nil {
		fmt.Fprintf(stderr, "nc: %v\n", err)
		return 2
	}
	// One reader of stdin for the whole run: with -lk the connections
	// served one after another share it.
	in := make(chan []byte)
	if !o.noStdin {
		go func() {
			defer close(in)
			for {
				buf := make([]byte, 64<<10)
				n, err := stdin.Read(buf)
				if n > 0 {
					in <- buf[:n]
				}
				if err != nil {
					return
				}
			}
		}()
	}
	if o.listen {
		return ncListen(o, in, stdout, stderr)
	}
	return ncConnect(o, in, stdout, stderr)
}

func parseNCArgs(args []string) (*ncOpts, error) {
	o := &ncOpts{}
	for i := 0; i < len(args); i++ {
		a := args[i]
		if len(a) < 2 || a[0] != '-' {
			o.args = append(o.args, a)
			continue
		}
		for j := 1; j < len(a); j++ {
			c := a[j]
			switch c {
			case 'v':
				o.verbose = true
			case 'u':
				o.udp = true
			case 'z':
				o.zero = true
			case 'l':
				o.listen = true
			case 'k':
				o.keep = true
			case 'U':
				o.unix = true
			case 'd':
				o.noStdin = true
			case '4', '6':
				o.family = string(c)
			case 't', 'n', 'N', 'D': // telnet, no DNS, shutdown on EOF (always), debug
			case 'w', 'q', 'p', 's':
				v := a[j+1:]
				if v == "" {
					if i+1 >= len(args) {
						return nil, fmt.Errorf("option requires an argument -- %c", c)
					}
					i++
					v = args[i]
				}
				if err := o.setValue(c, v); err != nil {
					return nil, err
				}
				j = len(a)
			default:
				return nil, fmt.Errorf("unsupported option -%c", c)
			}
		}
	}
	return o, nil
}

func (o *ncOpts) setValue(c byte, v string) error {
	var err error
	switch c {
	case 'w':
		o.wait, err = parseSeconds(v)
	case 'q':
		o.quit, err = parseSeconds(v)
		o.hasQuit = true
	case 'p':
		o.localPort = v
	case 's':
		o.source = v
	}
	if err != nil {
		return fmt.Errorf("timeout %q is invalid", v)
	}
	return nil
}

func (o *ncOpts) network() string {
	switch {
	case o.unix && o.udp:
		return "unixgram"
	case o.unix:
		return "unix"
	case o.udp:
		return "udp" + o.family
	}
	return "tcp" + o.family
}

func (o *ncOpts) proto() string {
	if o.udp {
		return "udp"
	}
	return "tcp"
}

func ncConnect(o *ncOpts, in <-chan []byte, stdout, stderr io.Writer) int {
	var addr, host, port string
	switch {
	case o.unix && len(o.args) == 1:
		addr = o.args[0]
	case !o.unix && len(o.args) == 2:
		host, port = o.args[0], o.args[1]
		addr = net.JoinHostPort(host, port)
	default:
		fmt.Fprintln(stderr, "usage: nc [-46dklNnUtuvz] [-p port] [-q secs] [-s source] [-w secs] [host] [port]")
		return 2
	}
	d := &net.Dialer{Timeout: o.wait}
	if o.source != "" || o.localPort != "" {
		la, err := ncLocalAddr(o)
		if err != nil {
			fmt.Fprintf(stderr, "nc: %v\n", err)
			return 1
		}
		d.LocalAddr = la
	}
	conn, err := d.Dial(o.network(), addr)
	var dnsErr *net.DNSError
	switch {
	case errors.As(err, &dnsErr):
		fmt.Fprintf(stderr, "nc: getaddrinfo for host %q port %s: Name or service not known\n", host, port)
		return 1
	case err != nil && o.unix:
		fmt.Fprintf(stderr, "nc: unix connect failed: %s\n", errnoText(err))
		return 1
	case err != nil:
		fmt.Fprintf(stderr, "nc: connect to %s port %s (%s) failed: %s\n", host, port, o.proto(), errnoText(err))
		return 1
	}
	defer conn.Close()
	if o.verbose && !o.unix {
		fmt.Fprintf(stderr, "Connection to %s %s port [%s/*] succeeded!\n", host, port, o.proto())
	}
	if o.zero {
		if o.udp {
			conn.Write(nil)
		}
		return 0
	}
	return ncSession(o, conn, in, stdout, stderr)
}

func ncLocalAddr(o *ncOpts) (net.Addr, error) {
	ip := net.ParseIP(o.source)
	if o.source != "" && ip == nil {
		return nil, fmt.Errorf("invalid source address %q", o.source)
	}
	port := 0
	if o.localPort != "" {
		var err error
		if port, err = strconv.Atoi(o.localPort); err != nil || port < 0 || port > 65535 {
			return nil, fmt.Errorf("port number invalid: %s", o.localPort)
		}
	}
	if o.udp {
		return &net.UDPAddr{IP: ip, Port: port}, nil
	}
	return &net.TCPAddr{IP: ip, Port: port}, nil
}

// ncListen serves one connection, or with -k one after another. UDP
// serves the first peer that sends, as OpenBSD nc -ul does.
func ncListen(o *ncOpts, in <-chan []byte, stdout, stderr io.Writer) int {
	addr := ""
	switch {
	case o.unix && len(o.args) == 1:
		addr = o.args[0]
	case o.unix:
		fmt.Fprintln(stderr, "nc: -lU needs a socket path")
		return 2
	case o.localPort != "" && len(o.args) <= 1:
		addr = net.JoinHostPort(strings.Join(o.args, ""), o.localPort)
	case o.localPort == "" && len(o.args) == 1:
		addr = net.JoinHostPort("", o.args[0])
	case o.localPort == "" && len(o.args) == 2:
		addr = net.JoinHostPort(o.args[0], o.args[1])
	default:
		fmt.Fprintln(stderr, "nc: -l needs a port: nc -l [-p] port or nc -l host port")
		return 2
	}
	if o.udp {
		pc, err := net.ListenPacket(o.network(), addr)
		if err != nil {
			fmt.Fprintf(stderr, "nc: %s\n", errnoText(err))
			return 1
		}
		defer pc.Close()
		return ncSession(o, newPacketPeer(pc), in, stdout, stderr)
	}
	ln, err := net.Listen(o.network(), addr)
	if err != nil {
		fmt.Fprintf(stderr, "nc: %s\n", errnoText(err))
		return 1
	}
	defer ln.Close()
	for {
		conn, err := ln.Accept()
		if err != nil {
			fmt.Fprintf(stderr, "nc: accept: %s\n", errnoText(err))
			return 1
		}
		if o.verbose {
			from := conn.RemoteAddr().String()
			if host, port, err := net.SplitHostPort(from); err == nil {
				from = host + " " + port
			}
			fmt.Fprintf(stderr, "Connection received on %s\n", from)
		}
		code := ncSession(o, conn, in, stdout, stderr)
		conn.Close()
		if !o.keep {
			return code
		}
	}
}

// ncSession copies in to conn and conn to stdout. At the end of stdin a
// stream is half-closed and nc keeps reading until the peer closes. -w
// is an idle timeout for the whole session (as OpenBSD nc polls with
// it), and -q, when given, replaces it once stdin has ended.
func ncSession(o *ncOpts, conn net.Conn, in <-chan []byte, stdout, stderr io.Writer) int {
	var idle atomic.Int64
	idle.Store(int64(o.wait))
	bump := func() {
		if d := time.Duration(idle.Load()); d > 0 {
			conn.SetReadDeadline(time.Now().Add(d))
		}
	}
	bump()
	done, writerDone := make(chan struct{}), make(chan struct{})
	defer func() {
		close(done)
		if o.keep { // the next connection's session reads stdin next
			conn.SetWriteDeadline(time.Now())
			<-writerDone
		}
	}()
	go func() {
		defer close(writerDone)
		for {
			select {
			case b, ok := <-in:
				if !ok {
					if cw, ok := conn.(interface{ CloseWrite() error }); ok && !o.udp {
						cw.CloseWrite()
					}
					if o.hasQuit { // -q 0 too: quit right away
						idle.Store(int64(o.quit))
						conn.SetReadDeadline(time.Now().Add(o.quit))
					} else {
						bump()
					}
					return
				}
				if _, err := conn.Write(b); err != nil {
					return
				}
				bump()
			case <-done:
				return
			}
		}
	}()
	buf := make([]byte, 64<<10)
	for {
		n, err := conn.Read(buf)
		if n > 0 {
			if _, werr := stdout.Write(buf[:n]); werr != nil {
				return 1
			}
			bump()
		}
		switch {
		case err == nil:
		case errors.Is(err, io.EOF), isTimeout(err):
			return 0
		default:
			fmt.Fprintf(stderr, "nc: read: %s\n", errnoText(err))
			return 1
		}
	}
}

// packetPeer makes a listening UDP socket a connection to the first peer
// that sends to it: reads from others are dropped, writes go to it.
type packetPeer struct {
	net.PacketConn
	peer  atomic.Pointer[net.Addr]
	ready chan struct{} // closed when peer is set
}

func newPacketPeer(pc net.PacketConn) *packetPeer {
	return &packetPeer{PacketConn: pc, ready: make(chan struct{})}
}

func (p *packetPeer) Read(b []byte) (int, error) {
	for {
		n, from, err := p.ReadFrom(b)
		if err != nil {
			return n, err
		}
		if p.peer.CompareAndSwap(nil, &from) {
			close(p.ready)
			return n, nil
		}
		if (*p.peer.Load()).String() == from.String() {
			return n, nil
		}
	}
}

// Write waits for the first peer: until then there is nobody to send to.
func (p *packetPeer) Write(b []byte) (int, error) {
	<-p.ready
	return p.WriteTo(b, *p.peer.Load())
}

func (p *packetPeer) RemoteAddr() net.Addr {
	if peer := p.peer.Load(); peer != nil {
		return *peer
	}
	return nil
}

var _ net.Conn = (*packetPeer)(nil)
