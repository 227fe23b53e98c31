package nodenames

import (
	"context"
	"encoding/binary"
	"io"
	"net"
	"net/netip"
	"slices"
	"sync"
	"testing"
	"time"

	"golang.org/x/net/dns/dnsmessage"
)

// nameserver is a real DNS server on loopback (UDP and TCP on one port):
// example.test. has 192.0.2.7; big.test. has 40 addresses, too many for
// a UDP answer (it sets TC there); every other name is NXDOMAIN. It
// records the names it was asked.
type nameserver struct {
	addr string
	mu   sync.Mutex
	seen []string
}

func startNameserver(t *testing.T) *nameserver {
	t.Helper()
	tl, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	ul, err := net.ListenPacket("udp", tl.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { tl.Close(); ul.Close() })
	ns := &nameserver{addr: tl.Addr().String()}
	go func() {
		buf := make([]byte, 65535)
		for {
			n, from, err := ul.ReadFrom(buf)
			if err != nil {
				return
			}
			if a := ns.answer(buf[:n], true); a != nil {
				ul.WriteTo(a, from)
			}
		}
	}()
	go func() {
		for {
			c, err := tl.Accept()
			if err != nil {
				return
			}
			go func() {
				defer c.Close()
				var l [2]byte
				if _, err := io.ReadFull(c, l[:]); err != nil {
					return
				}
				q := make([]byte, binary.BigEndian.Uint16(l[:]))
				if _, err := io.ReadFull(c, q); err != nil {
					return
				}
				a := ns.answer(q, false)
				c.Write(append(binary.BigEndian.AppendUint16(nil, uint16(len(a))), a...))
			}()
		}
	}()
	return ns
}

func (ns *nameserver) answer(q []byte, udp bool) []byte {
	var p dnsmessage.Parser
	h, err := p.Start(q)
	if err != nil {
		return nil
	}
	question, err := p.Question()
	if err != nil {
		return nil
	}
	ns.mu.Lock()
	ns.seen = append(ns.seen, question.Name.String())
	ns.mu.Unlock()
	var answers []answerRecord
	rcode := dnsmessage.RCodeSuccess
	switch question.Name.String() {
	case "example.test.":
		if question.Type == dnsmessage.TypeA {
			answers = append(answers, answerRecord{addr: netip.MustParseAddr("192.0.2.7")})
		}
	case "big.test.":
		if question.Type == dnsmessage.TypeA {
			for i := range 40 {
				answers = append(answers, answerRecord{addr: netip.AddrFrom4([4]byte{198, 51, 100, byte(i)})})
			}
		}
	default:
		rcode = dnsmessage.RCodeNameError
	}
	if udp && len(answers) > 20 {
		h.Truncated = true
		answers = nil
	}
	a, err := buildAnswer(h, question, rcode, answers)
	if err != nil {
		return nil
	}
	if h.Truncated {
		a[2] |= 0x02 // TC
	}
	return a
}

func (ns *nameserver) asked() []string {
	ns.mu.Lock()
	defer ns.mu.Unlock()
	return slices.Clone(ns.seen)
}

// TestResolver: node IDs and their addresses come from the table and
// never reach the nameserver, nor do node IDs with a search suffix; other
// names are the nameserver's, over UDP and, for a truncated answer, TCP.
func TestResolver(t *testing.T) {
	ns := startNameserver(t)
	table := NewTable()
	table.Set(map[string]string{"plinth-aa": "10.0.0.1", "plinth-bb": "fd00::2", "bogus": "not-an-address"})
	r := table.Resolver()
	// The nameserver Go would read from /etc/resolv.conf is the test's.
	r.Dial = func(ctx context.Context, network, _ string) (net.Conn, error) {
		return table.dial(ctx, network, ns.addr)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()

	host := func(name string, want ...string) {
		t.Helper()
		got, err := r.LookupHost(ctx, name)
		if len(want) == 0 {
			if dnsErr, ok := err.(*net.DNSError); !ok || !dnsErr.IsNotFound {
				t.Errorf("LookupHost(%s) = %v, %v; want not found", name, got, err)
			}
			return
		}
		slices.Sort(got)
		if err != nil || !slices.Equal(got, want) {
			t.Errorf("LookupHost(%s) = %v, %v; want %v", name, got, err, want)
		}
	}
	host("plinth-aa", "10.0.0.1")
	host("PLINTH-AA.", "10.0.0.1")
	host("plinth-bb", "fd00::2")
	host("plinth-aa.example.com")
	host("bogus")
	if names, err := r.LookupAddr(ctx, "10.0.0.1"); err != nil || !slices.Equal(names, []string{"plinth-aa."}) {
		t.Errorf("LookupAddr(10.0.0.1) = %v, %v", names, err)
	}
	if names, err := r.LookupAddr(ctx, "fd00::2"); err != nil || !slices.Equal(names, []string{"plinth-bb."}) {
		t.Errorf("LookupAddr(fd00::2) = %v, %v", names, err)
	}
	for _, q := range ns.asked() {
		if q != "bogus." && q != "bogus.example.com." {
			t.Errorf("the nameserver was asked %q", q)
		}
	}

	host("example.test", "192.0.2.7")
	big, err := r.LookupHost(ctx, "big.test")
	if err != nil || len(big) != 40 {
		t.Errorf("LookupHost(big.test) = %d addresses, %v; want 40 (over TCP)", len(big), err)
	}
	host("nothing.test")
	if _, err := r.LookupAddr(ctx, "10.9.9.9"); err == nil {
		t.Errorf("LookupAddr(10.9.9.9) answered; the nameserver has no such name")
	}
	asked := ns.asked()
	for _, want := range []string{"example.test.", "big.test.", "nothing.test.", "9.9.9.10.in-addr.arpa."} {
		if !slices.Contains(asked, want) {
			t.Errorf("the nameserver was not asked %s (asked %v)", want, asked)
		}
	}

	// A new table replaces the old one.
	table.Set(map[string]string{"plinth-aa": "10.0.0.9"})
	host("plinth-aa", "10.0.0.9")
	host("plinth-bb")
}

func TestParseReverse(t *testing.T) {
	for _, a := range []string{"10.1.2.3", "fd00::2", "2001:db8::8a2e:370:7334"} {
		want := netip.MustParseAddr(a)
		arpa := reverseName(want)
		if got, ok := parseReverse(arpa); !ok || got != want {
			t.Errorf("parseReverse(%s) = %v, %v; want %v", arpa, got, ok, want)
		}
	}
	for _, bad := range []string{"1.2.3.in-addr.arpa.", "x.3.2.1.in-addr.arpa.", "1.ip6.arpa.", "example.com."} {
		if a, ok := parseReverse(bad); ok {
			t.Errorf("parseReverse(%s) = %v", bad, a)
		}
	}
}

// reverseName is a's reverse name, as Go's resolver writes it.
func reverseName(a netip.Addr) string {
	if a.Is4() {
		b := a.As4()
		return netip.AddrFrom4([4]byte{b[3], b[2], b[1], b[0]}).String() + ".in-addr.arpa."
	}
	const hex = "0123456789abcdef"
	b := a.As16()
	var s []byte
	for i := 15; i >= 0; i-- {
		s = append(s, hex[b[i]&0xf], '.', hex[b[i]>>4], '.')
	}
	return string(s) + "ip6.arpa."
}
