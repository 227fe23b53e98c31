package nodenames

import (
	"context"
	"encoding/binary"
	"io"
	"net"
	"net/netip"
	"strconv"
	"strings"
	"time"

	"golang.org/x/net/dns/dnsmessage"
)

// forwardTimeout bounds a forwarded exchange when Go set no deadline.
const forwardTimeout = 5 * time.Second

// conn is what the resolver's Dial returns: a stream (each message after
// its two-byte length, as over TCP; it is no net.PacketConn, so Go frames
// even its "udp" queries so) that answers each query on Write and hands
// the answer to the next Reads. A query the table does not answer goes to
// the nameserver Go chose, over the network Go chose: a truncated UDP
// answer makes Go ask again over "tcp", as it would the nameserver.
type conn struct {
	t                *Table
	network, address string
	deadline         time.Time
	in, out          []byte // buffered query bytes, answers not yet read
	closed           bool
}

func newConn(t *Table, network, address string) *conn {
	return &conn{t: t, network: network, address: address}
}

func (c *conn) Write(b []byte) (int, error) {
	if c.closed {
		return 0, net.ErrClosed
	}
	c.in = append(c.in, b...)
	for len(c.in) >= 2 {
		l := int(binary.BigEndian.Uint16(c.in))
		if len(c.in) < 2+l {
			break
		}
		q := c.in[2 : 2+l]
		c.in = c.in[2+l:]
		a, err := c.exchange(q)
		if err != nil {
			return 0, err
		}
		c.out = binary.BigEndian.AppendUint16(c.out, uint16(len(a)))
		c.out = append(c.out, a...)
	}
	return len(b), nil
}

func (c *conn) Read(b []byte) (int, error) {
	if c.closed {
		return 0, net.ErrClosed
	}
	if len(c.out) == 0 {
		return 0, io.EOF
	}
	n := copy(b, c.out)
	c.out = c.out[n:]
	return n, nil
}

func (c *conn) Close() error                       { c.closed = true; return nil }
func (c *conn) LocalAddr() net.Addr                { return addr("nodenames") }
func (c *conn) RemoteAddr() net.Addr               { return addr(c.address) }
func (c *conn) SetDeadline(t time.Time) error      { c.deadline = t; return nil }
func (c *conn) SetReadDeadline(t time.Time) error  { c.deadline = t; return nil }
func (c *conn) SetWriteDeadline(t time.Time) error { c.deadline = t; return nil }

type addr string

func (a addr) Network() string { return "nodenames" }
func (a addr) String() string  { return string(a) }

// exchange answers one query: from the table, or from the nameserver.
func (c *conn) exchange(q []byte) ([]byte, error) {
	if a, ok := c.t.answer(q); ok {
		return a, nil
	}
	ctx := context.Background()
	deadline := c.deadline
	if deadline.IsZero() {
		deadline = time.Now().Add(forwardTimeout)
	}
	ctx, cancel := context.WithDeadline(ctx, deadline)
	defer cancel()
	return forward(ctx, c.network, c.address, q)
}

// forward sends q to the nameserver at address and returns its answer.
func forward(ctx context.Context, network, address string, q []byte) ([]byte, error) {
	var d net.Dialer // address is the nameserver's IP: nothing to resolve
	nc, err := d.DialContext(ctx, network, address)
	if err != nil {
		return nil, err
	}
	defer nc.Close()
	if dl, ok := ctx.Deadline(); ok {
		nc.SetDeadline(dl)
	}
	if _, ok := nc.(net.PacketConn); ok {
		if _, err := nc.Write(q); err != nil {
			return nil, err
		}
		buf := make([]byte, 65535)
		for {
			n, err := nc.Read(buf)
			if err != nil {
				return nil, err
			}
			if n >= 2 && buf[0] == q[0] && buf[1] == q[1] {
				return buf[:n], nil
			}
			// Another query's answer, late: keep waiting for ours.
		}
	}
	if _, err := nc.Write(binary.BigEndian.AppendUint16(nil, uint16(len(q)))); err != nil {
		return nil, err
	}
	if _, err := nc.Write(q); err != nil {
		return nil, err
	}
	var l [2]byte
	if _, err := io.ReadFull(nc, l[:]); err != nil {
		return nil, err
	}
	a := make([]byte, binary.BigEndian.Uint16(l[:]))
	_, err = io.ReadFull(nc, a)
	return a, err
}

// answer builds the table's answer to the query q, if it has one: the
// addresses of a known name (none of a type it has none of), the names of
// a known address, NXDOMAIN for a known name with a suffix.
func (t *Table) answer(q []byte) ([]byte, bool) {
	var p dnsmessage.Parser
	h, err := p.Start(q)
	if err != nil || h.Response || h.OpCode != 0 {
		return nil, false
	}
	qs, err := p.AllQuestions()
	if err != nil || len(qs) != 1 || qs[0].Class != dnsmessage.ClassINET {
		return nil, false
	}
	question := qs[0]
	name := question.Name.String()
	rcode := dnsmessage.RCodeSuccess
	var answers []answerRecord
	if addrs, ok := t.Lookup(name); ok {
		for _, a := range addrs {
			if (question.Type == dnsmessage.TypeA && a.Is4()) || (question.Type == dnsmessage.TypeAAAA && a.Is6()) {
				answers = append(answers, answerRecord{addr: a})
			}
		}
	} else if a, ok := parseReverse(name); ok && question.Type == dnsmessage.TypePTR && len(t.names(a)) > 0 {
		for _, n := range t.names(a) {
			answers = append(answers, answerRecord{name: n})
		}
	} else if t.shadows(name) {
		rcode = dnsmessage.RCodeNameError
	} else {
		return nil, false
	}
	b, err := buildAnswer(h, question, rcode, answers)
	return b, err == nil
}

// answerRecord is an address (A or AAAA) or a name (PTR).
type answerRecord struct {
	addr netip.Addr
	name string
}

const answerTTL = 5 // seconds; Go's resolver keeps nothing, others may

func buildAnswer(qh dnsmessage.Header, q dnsmessage.Question, rcode dnsmessage.RCode, answers []answerRecord) ([]byte, error) {
	b := dnsmessage.NewBuilder(nil, dnsmessage.Header{
		ID: qh.ID, Response: true, Authoritative: true,
		RecursionDesired: qh.RecursionDesired, RecursionAvailable: true, RCode: rcode,
	})
	b.EnableCompression()
	if err := b.StartQuestions(); err != nil {
		return nil, err
	}
	if err := b.Question(q); err != nil {
		return nil, err
	}
	if err := b.StartAnswers(); err != nil {
		return nil, err
	}
	rh := dnsmessage.ResourceHeader{Name: q.Name, Class: dnsmessage.ClassINET, TTL: answerTTL}
	for _, a := range answers {
		var err error
		switch {
		case a.name != "":
			n, nerr := dnsmessage.NewName(a.name + ".")
			if nerr != nil {
				return nil, nerr
			}
			err = b.PTRResource(rh, dnsmessage.PTRResource{PTR: n})
		case a.addr.Is4():
			err = b.AResource(rh, dnsmessage.AResource{A: a.addr.As4()})
		default:
			err = b.AAAAResource(rh, dnsmessage.AAAAResource{AAAA: a.addr.As16()})
		}
		if err != nil {
			return nil, err
		}
	}
	return b.Finish()
}

// parseReverse reads a reverse name (4.3.2.1.in-addr.arpa., or 32
// nibbles then ip6.arpa.) back into its address.
func parseReverse(name string) (netip.Addr, bool) {
	name = strings.ToLower(strings.TrimSuffix(name, "."))
	if v4, ok := strings.CutSuffix(name, ".in-addr.arpa"); ok {
		p := strings.Split(v4, ".")
		if len(p) != 4 {
			return netip.Addr{}, false
		}
		a, err := netip.ParseAddr(p[3] + "." + p[2] + "." + p[1] + "." + p[0])
		return a, err == nil
	}
	if v6, ok := strings.CutSuffix(name, ".ip6.arpa"); ok {
		p := strings.Split(v6, ".")
		if len(p) != 32 {
			return netip.Addr{}, false
		}
		var b [16]byte
		for i, nib := range p {
			v, err := strconv.ParseUint(nib, 16, 4)
			if err != nil || len(nib) != 1 {
				return netip.Addr{}, false
			}
			// p[0] is the lowest nibble of the last byte.
			pos := 31 - i
			b[pos/2] |= byte(v) << (4 * (1 - pos%2))
		}
		return netip.AddrFrom16(b), true
	}
	return netip.Addr{}, false
}
