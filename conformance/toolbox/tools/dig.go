package tools

import (
	"fmt"
	"io"
	"net"
	"strconv"
	"strings"
	"time"

	"github.com/miekg/dns"
)

// resolvConfPath is where dig finds its servers, search list and ndots;
// a variable so tests can use their own.
var resolvConfPath = "/etc/resolv.conf"

// digTypes are the query types dig takes by name here. dig takes a bare
// word that is a type name as the type, so the list is kept to the types
// the tests use rather than all of miekg/dns's.
var digTypes = map[string]uint16{"A": dns.TypeA, "AAAA": dns.TypeAAAA, "PTR": dns.TypePTR,
	"SRV": dns.TypeSRV, "CNAME": dns.TypeCNAME, "TXT": dns.TypeTXT, "MX": dns.TypeMX,
	"NS": dns.TypeNS, "SOA": dns.TypeSOA, "ANY": dns.TypeANY}

type digQuery struct {
	name    string
	qtype   uint16
	typeSet bool
}

type digOpts struct {
	server, port                    string
	tcp, search, short, recurse     bool
	cmd, comments, question, answer bool
	authority, additional, stats    bool
	timeout                         time.Duration
	tries                           int
	queries                         []digQuery
}

func digMain(args []string, stdin io.Reader, stdout, stderr io.Writer) int {
	o, err := parseDigArgs(args[1:])
	if err != nil {
		fmt.Fprintf(stderr, "dig: %v\nusage: dig [@server] [-p port] [-x addr] [name] [type] [+[no]tcp|search|short|all|answer|...] [+time=N] [+tries=N]\n", err)
		return 1
	}
	cfg, err := dns.ClientConfigFromFile(resolvConfPath)
	if err != nil { // dig too falls back to a local server
		cfg = &dns.ClientConfig{Servers: []string{"127.0.0.1"}, Port: "53", Ndots: 1}
	}
	servers := cfg.Servers
	if o.server != "" {
		servers = []string{o.server}
		if net.ParseIP(o.server) == nil {
			if servers, err = net.LookupHost(o.server); err != nil {
				fmt.Fprintf(stderr, "dig: couldn't get address for '%s': not found\n", o.server)
				return 10
			}
		}
	}
	port := o.port
	if port == "" {
		port = cfg.Port
	}
	if port == "" {
		port = "53"
	}
	if o.cmd && !o.short {
		fmt.Fprintf(stdout, "\n; <<>> DiG (plinth e2etools) <<>> %s\n", strings.Join(args[1:], " "))
	}
	code := 0
	for _, q := range o.queries {
		var resp *dns.Msg
		var server string
		var rtt time.Duration
		for _, name := range digNames(q.name, o.search, cfg) {
			resp, server, rtt, err = digExchange(o, name, q.qtype, servers, port)
			if err != nil {
				break
			}
			// +search goes on past NXDOMAIN and empty answers, as dig does.
			if resp.Rcode == dns.RcodeSuccess && len(resp.Answer) > 0 {
				break
			}
		}
		if err != nil {
			fmt.Fprintln(stdout, ";; connection timed out; no servers could be reached")
			code = 9
			continue
		}
		digPrint(stdout, o, resp, server, rtt)
	}
	return code
}

func parseDigArgs(args []string) (*digOpts, error) {
	o := &digOpts{recurse: true, cmd: true, comments: true, question: true, answer: true,
		authority: true, additional: true, stats: true, timeout: 5 * time.Second, tries: 3}
	pending := dns.TypeA
	pendingSet := false
	setType := func(t uint16) {
		if n := len(o.queries); n > 0 && !o.queries[n-1].typeSet {
			o.queries[n-1].qtype, o.queries[n-1].typeSet = t, true
			return
		}
		pending, pendingSet = t, true
	}
	addName := func(name string) {
		o.queries = append(o.queries, digQuery{name, pending, pendingSet})
		pending, pendingSet = dns.TypeA, false
	}
	for i := 0; i < len(args); i++ {
		a := args[i]
		value := func() (string, error) {
			if i+1 >= len(args) {
				return "", fmt.Errorf("option %s needs a value", a)
			}
			i++
			return args[i], nil
		}
		switch {
		case strings.HasPrefix(a, "@"):
			o.server = a[1:]
		case strings.HasPrefix(a, "+"):
			if err := o.plus(a[1:]); err != nil {
				return nil, err
			}
		case a == "-4", a == "-6":
		case a == "-p", a == "-x", a == "-t", a == "-q", a == "-c":
			v, err := value()
			if err != nil {
				return nil, err
			}
			switch a {
			case "-p":
				o.port = v
			case "-x":
				rev, err := dns.ReverseAddr(v)
				if err != nil {
					return nil, fmt.Errorf("invalid IP address %s", v)
				}
				addName(rev)
				setType(dns.TypePTR)
			case "-t":
				t, ok := digTypes[strings.ToUpper(v)]
				if !ok {
					return nil, fmt.Errorf("unsupported type %s", v)
				}
				setType(t)
			case "-q":
				addName(v)
			case "-c":
				if !strings.EqualFold(v, "IN") {
					return nil, fmt.Errorf("unsupported class %s", v)
				}
			}
		case len(a) > 1 && a[0] == '-':
			return nil, fmt.Errorf("invalid option: %s", a)
		case strings.EqualFold(a, "IN"):
		default:
			if t, ok := digTypes[strings.ToUpper(a)]; ok {
				setType(t)
			} else {
				addName(a)
			}
		}
	}
	if len(o.queries) == 0 { // dig with no name asks for the root servers
		q := digQuery{".", dns.TypeNS, true}
		if pendingSet {
			q.qtype = pending
		}
		o.queries = append(o.queries, q)
	}
	return o, nil
}

// plus sets a +option; dig's options the tests do not use are ignored.
func (o *digOpts) plus(opt string) error {
	name, val, _ := strings.Cut(opt, "=")
	on := !strings.HasPrefix(name, "no")
	if !on {
		name = name[2:]
	}
	switch name {
	case "tcp", "vc":
		o.tcp = on
	case "search":
		o.search = on
	case "short":
		o.short = on
	case "recurse":
		o.recurse = on
	case "all":
		o.cmd, o.comments, o.question, o.answer = on, on, on, on
		o.authority, o.additional, o.stats = on, on, on
	case "cmd":
		o.cmd = on
	case "comments":
		o.comments = on
	case "question":
		o.question = on
	case "answer":
		o.answer = on
	case "authority":
		o.authority = on
	case "additional":
		o.additional = on
	case "stats":
		o.stats = on
	case "time", "tries", "retry":
		n, err := strconv.Atoi(val)
		if err != nil || n < 0 {
			return fmt.Errorf("invalid +%s value %q", name, val)
		}
		switch name {
		case "time":
			o.timeout = time.Duration(max(n, 1)) * time.Second
		case "tries":
			o.tries = max(n, 1)
		case "retry":
			o.tries = n + 1
		}
	}
	return nil
}

// digNames is the names +search tries, in order: with fewer dots than
// ndots the search list's names first, then the name itself; otherwise,
// or when the name ends in a dot, only the name.
func digNames(name string, search bool, cfg *dns.ClientConfig) []string {
	if !search || dns.IsFqdn(name) || strings.Count(name, ".") >= cfg.Ndots {
		return []string{dns.Fqdn(name)}
	}
	names := make([]string, 0, len(cfg.Search)+1)
	for _, s := range cfg.Search {
		names = append(names, dns.Fqdn(name+"."+strings.TrimSuffix(s, ".")))
	}
	return append(names, dns.Fqdn(name))
}

// digExchange asks the servers in turn, +tries times over, and a UDP
// answer that was truncated again over TCP, as dig does.
func digExchange(o *digOpts, name string, qtype uint16, servers []string, port string) (*dns.Msg, string, time.Duration, error) {
	m := new(dns.Msg)
	m.SetQuestion(name, qtype)
	m.RecursionDesired = o.recurse
	m.SetEdns0(1232, false)
	udp := &dns.Client{Net: "udp", Timeout: o.timeout}
	tcp := &dns.Client{Net: "tcp", Timeout: o.timeout}
	c := udp
	if o.tcp {
		c = tcp
	}
	err := fmt.Errorf("no servers")
	for range o.tries {
		for _, s := range servers {
			addr := net.JoinHostPort(s, port)
			var r *dns.Msg
			var rtt time.Duration
			r, rtt, err = c.Exchange(m, addr)
			if err == nil && r.Truncated && !o.tcp {
				r, rtt, err = tcp.Exchange(m, addr)
			}
			if err == nil {
				return r, addr, rtt, nil
			}
		}
	}
	return nil, "", 0, err
}

func digPrint(w io.Writer, o *digOpts, r *dns.Msg, server string, rtt time.Duration) {
	if o.short {
		for _, rr := range r.Answer {
			fmt.Fprintln(w, strings.TrimPrefix(rr.String(), rr.Header().String()))
		}
		return
	}
	var extra []dns.RR
	for _, rr := range r.Extra {
		if rr.Header().Rrtype != dns.TypeOPT {
			extra = append(extra, rr)
		}
	}
	if o.comments {
		fmt.Fprintf(w, ";; Got answer:\n;; ->>HEADER<<- opcode: %s, status: %s, id: %d\n",
			dns.OpcodeToString[r.Opcode], dns.RcodeToString[r.Rcode], r.Id)
		fmt.Fprintf(w, ";; flags:%s; QUERY: %d, ANSWER: %d, AUTHORITY: %d, ADDITIONAL: %d\n",
			digFlags(r), len(r.Question), len(r.Answer), len(r.Ns), len(r.Extra))
	}
	if o.question {
		digSection(w, o, "QUESTION", len(r.Question), func() {
			for _, q := range r.Question {
				fmt.Fprintln(w, q.String())
			}
		})
	}
	for _, sec := range []struct {
		show bool
		name string
		rrs  []dns.RR
	}{{o.answer, "ANSWER", r.Answer}, {o.authority, "AUTHORITY", r.Ns}, {o.additional, "ADDITIONAL", extra}} {
		if sec.show {
			digSection(w, o, sec.name, len(sec.rrs), func() {
				for _, rr := range sec.rrs {
					fmt.Fprintln(w, rr.String())
				}
			})
		}
	}
	if o.stats {
		proto := "UDP"
		if o.tcp {
			proto = "TCP"
		}
		host, port, _ := net.SplitHostPort(server)
		fmt.Fprintf(w, "\n;; Query time: %d msec\n;; SERVER: %s#%s(%s) (%s)\n;; WHEN: %s\n;; MSG SIZE  rcvd: %d\n\n",
			rtt.Milliseconds(), host, port, host, proto,
			time.Now().Format("Mon Jan 02 15:04:05 MST 2006"), r.Len())
	}
}

// digSection prints a section as dig does: with comments a blank line
// and a title before it, and only when it has records.
func digSection(w io.Writer, o *digOpts, name string, n int, print func()) {
	if n == 0 {
		return
	}
	if o.comments {
		fmt.Fprintf(w, "\n;; %s SECTION:\n", name)
	}
	print()
}

func digFlags(r *dns.Msg) string {
	var b strings.Builder
	for _, f := range []struct {
		on   bool
		name string
	}{{r.Response, "qr"}, {r.Authoritative, "aa"}, {r.Truncated, "tc"}, {r.RecursionDesired, "rd"},
		{r.RecursionAvailable, "ra"}, {r.AuthenticatedData, "ad"}, {r.CheckingDisabled, "cd"}} {
		if f.on {
			b.WriteString(" " + f.name)
		}
	}
	return b.String()
}
