// Package netpol enforces NetworkPolicy on a worker, run as `kube
// network-policies`: it compiles the cluster's policies, pods and
// namespaces into one nftables table and replaces it whole, in one
// transaction, whenever any of them changes.
//
//	table inet plinth-netpol
//	  chain forward  (filter hook forward, priority filter: after kube-proxy's DNAT,
//	     │            so a Service VIP is already its endpoint's pod IP)
//	     ├─ ct state established,related accept
//	     ├─ ip saddr vmap @egress    local pod isolated for egress → jump eg-<pod>
//	     └─ ip daddr vmap @ingress   local pod isolated for ingress → jump in-<pod>
//	  chain eg-<pod> / in-<pod>: one rule per allowing rule of every policy
//	     selecting the pod (peers: a set of IPs and ranges; ports: an anonymous
//	     set of protocol . port), each ending in return; last: drop
//
// Each node enforces the policies of its own pods, the egress side of a
// connection where it starts and the ingress side where it ends, so a
// connection between nodes is checked at both. Traffic between a pod and
// its own node (the kubelet's probes, the node's DNS server) is not
// filtered: NetworkPolicy always allows it.
//
// Why nftables through knftables: kube-proxy's own library (already in the
// kube binary), no packet in userspace (unlike NFQUEUE-based enforcers),
// and a whole-table replacement is atomic: a packet sees the old rules or
// the new, never a mix.
package netpol

import (
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"net/netip"
	"slices"
	"sort"
	"strconv"
	"strings"

	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"sigs.k8s.io/knftables"
)

// Table is the nftables table (family inet) the rules live in.
const Table = "plinth-netpol"

// Pod is what the compiler needs of a pod.
type Pod struct {
	Namespace, Name string
	Labels          map[string]string
	IP              netip.Addr
	// Ports are its containers' named ports.
	Ports []NamedPort
	// Local: the pod runs on this node (its policies are enforced here).
	Local bool
}

// NamedPort is a container port with a name.
type NamedPort struct {
	Name     string
	Protocol corev1.Protocol
	Port     int32
}

// Ruleset is what Compile makes: the table's contents.
type Ruleset struct {
	// chains are the per-pod chains, by name, with their rules.
	chains map[string][]string
	// sets are the peer sets, by name, with their elements (addresses
	// and ranges).
	sets map[string][]string
	// ingress and egress map local pod IPs to their chains.
	ingress, egress map[string]string
}

// Compile makes the ruleset enforcing policies on the local pods among
// pods; namespaces are the namespaces' labels by name.
func Compile(policies []*networkingv1.NetworkPolicy, pods []Pod, namespaces map[string]map[string]string) *Ruleset {
	r := &Ruleset{chains: map[string][]string{}, sets: map[string][]string{}, ingress: map[string]string{}, egress: map[string]string{}}
	policies = slices.Clone(policies)
	slices.SortFunc(policies, func(a, b *networkingv1.NetworkPolicy) int {
		return strings.Compare(a.Namespace+"/"+a.Name, b.Namespace+"/"+b.Name)
	})
	for _, pod := range pods {
		if !pod.Local || !pod.IP.Is4() {
			continue
		}
		var in, eg []string
		isolatedIn, isolatedEg := false, false
		for _, p := range policies {
			if p.Namespace != pod.Namespace || !selects(&p.Spec.PodSelector, pod.Labels) {
				continue
			}
			ingress, egress := policyTypes(p)
			if ingress {
				isolatedIn = true
				for i, rule := range p.Spec.Ingress {
					in = append(in, r.rule(p, "in", i, "saddr", rule.From, rule.Ports, pod, pods, namespaces)...)
				}
			}
			if egress {
				isolatedEg = true
				for i, rule := range p.Spec.Egress {
					eg = append(eg, r.rule(p, "eg", i, "daddr", rule.To, rule.Ports, pod, pods, namespaces)...)
				}
			}
		}
		key := pod.Namespace + "/" + pod.Name
		if isolatedIn {
			name := "in-" + hash(key)
			r.chains[name] = append(in, "drop")
			r.ingress[pod.IP.String()] = name
		}
		if isolatedEg {
			name := "eg-" + hash(key)
			r.chains[name] = append(eg, "drop")
			r.egress[pod.IP.String()] = name
		}
	}
	return r
}

// policyTypes are the directions p isolates its pods in (as the API
// defaults policyTypes: Ingress always, Egress if it has egress rules).
func policyTypes(p *networkingv1.NetworkPolicy) (ingress, egress bool) {
	if len(p.Spec.PolicyTypes) == 0 {
		return true, len(p.Spec.Egress) > 0
	}
	for _, t := range p.Spec.PolicyTypes {
		switch t {
		case networkingv1.PolicyTypeIngress:
			ingress = true
		case networkingv1.PolicyTypeEgress:
			egress = true
		}
	}
	return ingress, egress
}

// selects reports whether sel selects labels (a malformed selector
// selects nothing).
func selects(sel *metav1.LabelSelector, l map[string]string) bool {
	s, err := metav1.LabelSelectorAsSelector(sel)
	return err == nil && s.Matches(labels.Set(l))
}

// rule is the chain rules of one ingress (dir "in", peers matched on
// addr "saddr") or egress ("eg", "daddr") rule i of p, for the local pod
// target: each allowed peer and port ends in return.
func (r *Ruleset) rule(p *networkingv1.NetworkPolicy, dir string, i int, addr string, peers []networkingv1.NetworkPolicyPeer,
	ports []networkingv1.NetworkPolicyPort, target Pod, pods []Pod, namespaces map[string]map[string]string) []string {
	peerMatch := ""
	var peerPods []Pod
	if len(peers) > 0 {
		set := fmt.Sprintf("%s-%s-%d", dir, hash(p.Namespace+"/"+p.Name), i)
		if _, done := r.sets[set]; !done {
			r.sets[set] = peerElements(p.Namespace, peers, pods, namespaces)
		}
		peerPods = peerPodsOf(p.Namespace, peers, pods, namespaces)
		peerMatch = "ip " + addr + " @" + set + " "
	}
	if len(ports) == 0 {
		return []string{peerMatch + "return"}
	}
	var numbered []string
	var out []string
	for _, port := range ports {
		proto := strings.ToLower(string(corev1.ProtocolTCP))
		if port.Protocol != nil {
			proto = strings.ToLower(string(*port.Protocol))
		}
		switch {
		case port.Port == nil:
			// Every port of the protocol.
			out = append(out, peerMatch+"meta l4proto "+proto+" return")
		case port.Port.StrVal != "" && dir == "in":
			// A named port of the target pod.
			for _, np := range target.Ports {
				if np.Name == port.Port.StrVal && strings.EqualFold(string(np.Protocol), proto) {
					numbered = append(numbered, proto+" . "+strconv.Itoa(int(np.Port)))
				}
			}
		case port.Port.StrVal != "":
			// A named port of the peer pods (with no peers: of any
			// pod), each peer's own number.
			of := peerPods
			if len(peers) == 0 {
				of = pods
			}
			var pairs []string
			for _, pp := range of {
				for _, np := range pp.Ports {
					if np.Name == port.Port.StrVal && strings.EqualFold(string(np.Protocol), proto) && pp.IP.Is4() {
						pairs = append(pairs, pp.IP.String()+" . "+proto+" . "+strconv.Itoa(int(np.Port)))
					}
				}
			}
			if pairs = sortedUnique(pairs); len(pairs) > 0 {
				out = append(out, "ip daddr . meta l4proto . th dport { "+strings.Join(pairs, ", ")+" } return")
			}
		case port.EndPort != nil && *port.EndPort > port.Port.IntVal:
			numbered = append(numbered, fmt.Sprintf("%s . %d-%d", proto, port.Port.IntVal, *port.EndPort))
		default:
			numbered = append(numbered, proto+" . "+strconv.Itoa(int(port.Port.IntVal)))
		}
	}
	if numbered = sortedUnique(numbered); len(numbered) > 0 {
		out = append(out, peerMatch+"meta l4proto . th dport { "+strings.Join(numbered, ", ")+" } return")
	}
	return out
}

// peerPodsOf are the pods peers select (by pod and namespace selector),
// for policy namespace ns.
func peerPodsOf(ns string, peers []networkingv1.NetworkPolicyPeer, pods []Pod, namespaces map[string]map[string]string) []Pod {
	var out []Pod
	for _, pod := range pods {
		for _, peer := range peers {
			if peer.IPBlock == nil && peerSelects(ns, peer, pod, namespaces) {
				out = append(out, pod)
				break
			}
		}
	}
	return out
}

// peerSelects reports whether peer (of a policy in ns; not an ipBlock)
// selects pod.
func peerSelects(ns string, peer networkingv1.NetworkPolicyPeer, pod Pod, namespaces map[string]map[string]string) bool {
	if peer.NamespaceSelector == nil {
		if pod.Namespace != ns {
			return false
		}
	} else if !selects(peer.NamespaceSelector, namespaces[pod.Namespace]) {
		return false
	}
	return peer.PodSelector == nil || selects(peer.PodSelector, pod.Labels)
}

// peerElements are the set elements of peers: the selected pods'
// addresses and the ipBlocks less their exceptions, as ranges.
func peerElements(ns string, peers []networkingv1.NetworkPolicyPeer, pods []Pod, namespaces map[string]map[string]string) []string {
	var ranges []ipRange
	for _, pod := range peerPodsOf(ns, peers, pods, namespaces) {
		if pod.IP.Is4() {
			ranges = append(ranges, ipRange{pod.IP, pod.IP})
		}
	}
	for _, peer := range peers {
		if peer.IPBlock == nil {
			continue
		}
		block, err := netip.ParsePrefix(peer.IPBlock.CIDR)
		if err != nil || !block.Addr().Is4() {
			continue
		}
		rs := []ipRange{prefixRange(block)}
		for _, e := range peer.IPBlock.Except {
			if ex, err := netip.ParsePrefix(e); err == nil && ex.Addr().Is4() {
				rs = subtract(rs, prefixRange(ex))
			}
		}
		ranges = append(ranges, rs...)
	}
	return elements(merge(ranges))
}

// ipRange is [from, to], IPv4.
type ipRange struct{ from, to netip.Addr }

func prefixRange(p netip.Prefix) ipRange {
	p = p.Masked()
	from := p.Addr().As4()
	to := from
	host := 32 - p.Bits()
	for i := 3; i >= 0 && host > 0; i-- {
		bits := min(host, 8)
		to[i] |= byte(1<<bits - 1)
		host -= bits
	}
	return ipRange{netip.AddrFrom4(from), netip.AddrFrom4(to)}
}

// subtract is rs less x.
func subtract(rs []ipRange, x ipRange) []ipRange {
	var out []ipRange
	for _, r := range rs {
		if x.to.Less(r.from) || r.to.Less(x.from) {
			out = append(out, r)
			continue
		}
		if r.from.Less(x.from) {
			out = append(out, ipRange{r.from, x.from.Prev()})
		}
		if x.to.Less(r.to) {
			out = append(out, ipRange{x.to.Next(), r.to})
		}
	}
	return out
}

// merge sorts rs and joins ranges that overlap or touch (nft refuses
// overlapping elements in an interval set).
func merge(rs []ipRange) []ipRange {
	sort.Slice(rs, func(i, j int) bool { return rs[i].from.Less(rs[j].from) })
	var out []ipRange
	for _, r := range rs {
		if n := len(out); n > 0 && !out[n-1].to.Next().Less(r.from) {
			if out[n-1].to.Less(r.to) {
				out[n-1].to = r.to
			}
			continue
		}
		out = append(out, r)
	}
	return out
}

func elements(rs []ipRange) []string {
	var out []string
	for _, r := range rs {
		if r.from == r.to {
			out = append(out, r.from.String())
		} else {
			out = append(out, r.from.String()+"-"+r.to.String())
		}
	}
	return out
}

func sortedUnique(s []string) []string {
	slices.Sort(s)
	return slices.Compact(s)
}

// hash names a chain or set after key (nft names are short).
func hash(key string) string {
	h := sha256.Sum256([]byte(key))
	return hex.EncodeToString(h[:6])
}

// Write adds the ruleset to tx as the whole table: the old table (if
// any) goes in the same transaction.
func (r *Ruleset) Write(tx *knftables.Transaction) {
	tx.Add(&knftables.Table{})
	tx.Delete(&knftables.Table{})
	tx.Add(&knftables.Table{})
	for _, name := range sortedKeys(r.sets) {
		tx.Add(&knftables.Set{Name: name, Type: "ipv4_addr", Flags: []knftables.SetFlag{knftables.IntervalFlag}})
		for _, e := range r.sets[name] {
			tx.Add(&knftables.Element{Set: name, Key: []string{e}})
		}
	}
	for _, name := range sortedKeys(r.chains) {
		tx.Add(&knftables.Chain{Name: name})
		for _, rule := range r.chains[name] {
			tx.Add(&knftables.Rule{Chain: name, Rule: rule})
		}
	}
	for _, m := range []struct {
		name     string
		elements map[string]string
	}{{"ingress", r.ingress}, {"egress", r.egress}} {
		tx.Add(&knftables.Map{Name: m.name, Type: "ipv4_addr : verdict"})
		for _, ip := range sortedKeys(m.elements) {
			tx.Add(&knftables.Element{Map: m.name, Key: []string{ip}, Value: []string{"jump " + m.elements[ip]}})
		}
	}
	filter, forward, accept := knftables.FilterType, knftables.ForwardHook, knftables.AcceptPolicy
	prio := knftables.FilterPriority
	tx.Add(&knftables.Chain{Name: "forward", Type: &filter, Hook: &forward, Priority: &prio, Policy: &accept})
	for _, rule := range []string{"ct state established,related accept", "ip saddr vmap @egress", "ip daddr vmap @ingress"} {
		tx.Add(&knftables.Rule{Chain: "forward", Rule: rule})
	}
}

func sortedKeys[V any](m map[string]V) []string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	return keys
}
