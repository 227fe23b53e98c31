package tools

import (
	"net"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/miekg/dns"
)

// dnsServer is a cluster DNS stand-in on 127.0.0.1, over UDP and TCP on
// one port, recording the names it was asked for.
type dnsServer struct {
	port string
	mu   sync.Mutex
	log  []string // "udp name" or "tcp name"
}

var testZone = map[string]string{
	"svc.ns.svc.cluster.local. A":                "svc.ns.svc.cluster.local. 30 IN A 10.0.0.10",
	"svc6.ns.svc.cluster.local. AAAA":            "svc6.ns.svc.cluster.local. 30 IN AAAA fd00::10",
	"_http._tcp.svc.ns.svc.cluster.local. SRV":   "_http._tcp.svc.ns.svc.cluster.local. 30 IN SRV 0 100 80 svc.ns.svc.cluster.local.",
	"10.0.0.10.in-addr.arpa. PTR":                "10.0.0.10.in-addr.arpa. 30 IN PTR svc.ns.svc.cluster.local.",
	"kubernetes.default.svc.cluster.local. A":    "kubernetes.default.svc.cluster.local. 30 IN A 10.96.0.1",
	"ext.ns.svc.cluster.local. CNAME":            "ext.ns.svc.cluster.local. 30 IN CNAME example.org.",
	"tcponly.ns.svc.cluster.local. A":            "tcponly.ns.svc.cluster.local. 30 IN A 10.0.0.11",
	"truncated.ns.svc.cluster.local. A":          "truncated.ns.svc.cluster.local. 30 IN A 10.0.0.12",
	"txt.ns.svc.cluster.local. TXT":              `txt.ns.svc.cluster.local. 30 IN TXT "a b" "c"`,
	"kubernetes.default.svc.cluster.local. AAAA": "",
}

func startDNS(t *testing.T) *dnsServer {
	t.Helper()
	s := &dnsServer{}
	var pc net.PacketConn
	var ln net.Listener
	for range 10 { // a port free for both UDP and TCP
		var err error
		if pc, err = net.ListenPacket("udp", "127.0.0.1:0"); err != nil {
			t.Fatal(err)
		}
		if ln, err = net.Listen("tcp", pc.LocalAddr().String()); err == nil {
			break
		}
		pc.Close()
	}
	if ln == nil {
		t.Fatal("no port free for both UDP and TCP")
	}
	_, s.port, _ = net.SplitHostPort(pc.LocalAddr().String())
	udp := &dns.Server{PacketConn: pc, Handler: s}
	tcp := &dns.Server{Listener: ln, Handler: s}
	go udp.ActivateAndServe()
	go tcp.ActivateAndServe()
	t.Cleanup(func() { udp.Shutdown(); tcp.Shutdown() })
	return s
}

func (s *dnsServer) ServeDNS(w dns.ResponseWriter, r *dns.Msg) {
	q := r.Question[0]
	network := w.LocalAddr().Network()
	s.mu.Lock()
	s.log = append(s.log, network+" "+q.Name)
	s.mu.Unlock()
	m := new(dns.Msg)
	m.SetReply(r)
	m.RecursionAvailable = true
	rec, ok := testZone[q.Name+" "+dns.TypeToString[q.Qtype]]
	switch {
	case q.Name == "tcponly.ns.svc.cluster.local." && network == "udp":
		m.Rcode = dns.RcodeNameError
	case q.Name == "truncated.ns.svc.cluster.local." && network == "udp":
		m.Truncated = true
	case !ok:
		m.Rcode = dns.RcodeNameError
	case rec != "": // "" is a name without records of the type
		rr, err := dns.NewRR(rec)
		if err != nil {
			panic(err)
		}
		m.Answer = append(m.Answer, rr)
	}
	w.WriteMsg(m)
}

func (s *dnsServer) queries() []string {
	s.mu.Lock()
	defer s.mu.Unlock()
	q := s.log
	s.log = nil
	return q
}

func TestDig(t *testing.T) {
	s := startDNS(t)
	conf := filepath.Join(t.TempDir(), "resolv.conf")
	if err := os.WriteFile(conf, []byte("nameserver 127.0.0.1\nsearch ns.svc.cluster.local svc.cluster.local\noptions ndots:5\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	resolvConfPath = conf
	t.Cleanup(func() { resolvConfPath = "/etc/resolv.conf" })
	p := []string{"-p", s.port}
	dead := closedPort(t)

	for _, tc := range []struct {
		name    string
		args    []string
		want    result
		queries string // the names asked, in order
	}{
		{"search udp", []string{"+notcp", "+noall", "+answer", "+search", "svc"},
			result{"svc.ns.svc.cluster.local.\t30\tIN\tA\t10.0.0.10\n", "", 0}, "udp svc.ns.svc.cluster.local."},
		{"search tcp", []string{"+tcp", "+noall", "+answer", "+search", "svc", "A"},
			result{"svc.ns.svc.cluster.local.\t30\tIN\tA\t10.0.0.10\n", "", 0}, "tcp svc.ns.svc.cluster.local."},
		{"search second domain", []string{"+notcp", "+noall", "+answer", "+search", "kubernetes.default"},
			result{"kubernetes.default.svc.cluster.local.\t30\tIN\tA\t10.96.0.1\n", "", 0},
			"udp kubernetes.default.ns.svc.cluster.local.,udp kubernetes.default.svc.cluster.local."},
		{"search then as is", []string{"+notcp", "+noall", "+answer", "+search", "kubernetes.default.svc.cluster.local"},
			result{"kubernetes.default.svc.cluster.local.\t30\tIN\tA\t10.96.0.1\n", "", 0},
			"udp kubernetes.default.svc.cluster.local.ns.svc.cluster.local.," +
				"udp kubernetes.default.svc.cluster.local.svc.cluster.local.,udp kubernetes.default.svc.cluster.local."},
		{"search past empty answer", []string{"+tcp", "+noall", "+answer", "+search", "kubernetes.default", "AAAA"},
			result{"", "", 0}, "tcp kubernetes.default.ns.svc.cluster.local.,tcp kubernetes.default.svc.cluster.local.," +
				"tcp kubernetes.default."},
		{"not found", []string{"+notcp", "+noall", "+answer", "+search", "nothere"}, result{"", "", 0},
			"udp nothere.ns.svc.cluster.local.,udp nothere.svc.cluster.local.,udp nothere."},
		{"absolute no search", []string{"+noall", "+answer", "+search", "svc."}, result{"", "", 0}, "udp svc."},
		{"ptr", []string{"+notcp", "+noall", "+answer", "+search", "10.0.0.10.in-addr.arpa.", "PTR"},
			result{"10.0.0.10.in-addr.arpa.\t30\tIN\tPTR\tsvc.ns.svc.cluster.local.\n", "", 0}, "udp 10.0.0.10.in-addr.arpa."},
		{"srv", []string{"+tcp", "+noall", "+answer", "+search", "_http._tcp.svc", "SRV"},
			result{"_http._tcp.svc.ns.svc.cluster.local.\t30\tIN\tSRV\t0 100 80 svc.ns.svc.cluster.local.\n", "", 0},
			"tcp _http._tcp.svc.ns.svc.cluster.local."},
		{"short", []string{"+short", "svc.ns.svc.cluster.local"}, result{"10.0.0.10\n", "", 0}, "udp svc.ns.svc.cluster.local."},
		{"short no search", []string{"+short", "svc"}, result{"", "", 0}, "udp svc."},
		{"short search", []string{"+short", "+search", "svc"}, result{"10.0.0.10\n", "", 0}, "udp svc.ns.svc.cluster.local."},
		{"short srv", []string{"+short", "_http._tcp.svc.ns.svc.cluster.local", "srv"},
			result{"0 100 80 svc.ns.svc.cluster.local.\n", "", 0}, "udp _http._tcp.svc.ns.svc.cluster.local."},
		{"short reverse", []string{"+short", "-x", "10.0.0.10"}, result{"svc.ns.svc.cluster.local.\n", "", 0},
			"udp 10.0.0.10.in-addr.arpa."},
		{"short aaaa", []string{"svc6.ns.svc.cluster.local", "AAAA", "+short"}, result{"fd00::10\n", "", 0},
			"udp svc6.ns.svc.cluster.local."},
		{"short cname", []string{"+short", "-t", "CNAME", "ext.ns.svc.cluster.local."}, result{"example.org.\n", "", 0},
			"udp ext.ns.svc.cluster.local."},
		{"short txt", []string{"+short", "TXT", "txt.ns.svc.cluster.local."}, result{"\"a b\" \"c\"\n", "", 0},
			"udp txt.ns.svc.cluster.local."},
		{"vc", []string{"+vc", "+short", "tcponly.ns.svc.cluster.local"}, result{"10.0.0.11\n", "", 0},
			"tcp tcponly.ns.svc.cluster.local."},
		{"udp really", []string{"+short", "tcponly.ns.svc.cluster.local"}, result{"", "", 0},
			"udp tcponly.ns.svc.cluster.local."},
		{"truncated retried over tcp", []string{"+short", "truncated.ns.svc.cluster.local"}, result{"10.0.0.12\n", "", 0},
			"udp truncated.ns.svc.cluster.local.,tcp truncated.ns.svc.cluster.local."},
		{"two queries", []string{"+short", "svc.ns.svc.cluster.local", "AAAA", "svc6.ns.svc.cluster.local", "aaaa"},
			result{"fd00::10\n", "", 0}, "udp svc.ns.svc.cluster.local.,udp svc6.ns.svc.cluster.local."},
		{"server", []string{"@127.0.0.1", "+short", "+time=1", "+tries=2", "+nocookie", "svc.ns.svc.cluster.local", "A"},
			result{"10.0.0.10\n", "", 0}, "udp svc.ns.svc.cluster.local."},
		{"usage", []string{"-Z", "svc"}, result{"", "dig: invalid option: -Z\nusage: dig [@server] [-p port] [-x addr] " +
			"[name] [type] [+[no]tcp|search|short|all|answer|...] [+time=N] [+tries=N]\n", 1}, ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s.queries()
			check(t, run(digMain, "", append(append([]string{"dig"}, p...), tc.args...)...), tc.want)
			if got := strings.Join(s.queries(), ","); got != tc.queries {
				t.Errorf("queries %s, want %s", got, tc.queries)
			}
		})
	}

	t.Run("default output", func(t *testing.T) {
		got := run(digMain, "", "dig", "-p", s.port, "svc.ns.svc.cluster.local")
		for _, want := range []string{"; <<>> DiG (plinth e2etools) <<>> -p " + s.port + " svc.ns.svc.cluster.local\n",
			";; ->>HEADER<<- opcode: QUERY, status: NOERROR, id: ", ";; flags: qr rd ra; QUERY: 1, ANSWER: 1, AUTHORITY: 0, ADDITIONAL: 0\n",
			"\n;; QUESTION SECTION:\n;svc.ns.svc.cluster.local.\tIN\t A\n",
			"\n;; ANSWER SECTION:\nsvc.ns.svc.cluster.local.\t30\tIN\tA\t10.0.0.10\n",
			";; SERVER: 127.0.0.1#" + s.port + "(127.0.0.1) (UDP)\n"} {
			if !strings.Contains(got.stdout, want) {
				t.Errorf("stdout lacks %q:\n%s", want, got.stdout)
			}
		}
		if got.code != 0 || got.stderr != "" {
			t.Errorf("code %d, stderr %q", got.code, got.stderr)
		}
		got = run(digMain, "", "dig", "-p", s.port, "+noall", "+comments", "nothere.")
		if !strings.Contains(got.stdout, "status: NXDOMAIN") || strings.Contains(got.stdout, "SECTION") {
			t.Errorf("+noall +comments: %q", got.stdout)
		}
	})

	t.Run("no server", func(t *testing.T) {
		start := time.Now()
		got := run(digMain, "", "dig", "@127.0.0.1", "-p", dead, "+time=1", "+tries=2", "+noall", "+answer", "+search", "svc")
		check(t, got, result{";; connection timed out; no servers could be reached\n", "", 9})
		if d := time.Since(start); d > 3*time.Second {
			t.Errorf("took %v", d)
		}
	})

	t.Run("no resolv.conf", func(t *testing.T) {
		resolvConfPath = filepath.Join(t.TempDir(), "missing")
		defer func() { resolvConfPath = conf }()
		check(t, run(digMain, "", "dig", "-p", s.port, "+short", "svc.ns.svc.cluster.local"), result{"10.0.0.10\n", "", 0})
	})
}

func TestDigNames(t *testing.T) {
	cfg := &dns.ClientConfig{Search: []string{"a.local", "b.local."}, Ndots: 2}
	for _, tc := range []struct {
		name   string
		search bool
		want   string
	}{
		{"x", true, "x.a.local. x.b.local. x."},
		{"x.y", true, "x.y.a.local. x.y.b.local. x.y."},
		{"x.y.z", true, "x.y.z."},
		{"x.", true, "x."},
		{"x", false, "x."},
	} {
		if got := strings.Join(digNames(tc.name, tc.search, cfg), " "); got != tc.want {
			t.Errorf("digNames(%q, %v) = %s, want %s", tc.name, tc.search, got, tc.want)
		}
	}
	if _, err := parseDigArgs([]string{"+time=x"}); err == nil {
		t.Error("+time=x: no error")
	}
	o, err := parseDigArgs([]string{"+retry=0", "+time=2"})
	if err != nil || o.tries != 1 || o.timeout != 2*time.Second || o.queries[0].name != "." ||
		o.queries[0].qtype != dns.TypeNS {
		t.Errorf("parseDigArgs: %+v, %v", o, err)
	}
}
