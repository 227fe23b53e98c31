// Package nodenames answers a process's own lookups of the cluster's
// node IDs from memory, so that nothing on the node trusts a file a pod
// can reach for them.
//
//	etcd, gRPC, net.Dial ─► net.DefaultResolver = Table.Resolver()
//	                          │ Go's resolver: /etc/hosts first (the
//	                          │ system image's: localhost only, read-only)
//	                          ▼ then a DNS query over Dial
//	                        conn ─┬─ a node ID, its reverse name ─► Table
//	                              ├─ <node ID>.<suffix> ─► NXDOMAIN
//	                              └─ anything else ─► the nameserver Go
//	                                 chose, over the network Go chose
//
// Why: etcd's members advertise https://<node ID>:7834, so an address
// change needs no membership change, and etcd resolves those names (and,
// to check a peer's certificate, its address back to a name) through Go's
// resolver, which reads only /etc/hosts and DNS. /etc/hosts is the file
// the upstream conformance suite mounts into a pod, writable; so the node
// keeps its map here instead, in the Role Server's memory (and its cache
// on the data volume), and /etc/hosts is the system image's. Intercepting
// the resolver's DNS exchange rather than replacing lookups keeps every
// caller's behaviour (search lists, A and AAAA, timeouts) Go's own.
// Guarded by TestResolver and TestKubernetesTwoNodes (attackEtcHosts).
package nodenames

import (
	"context"
	"net"
	"net/netip"
	"strings"
	"sync"
)

// Table maps node IDs to addresses. The zero value is not usable; use
// NewTable.
type Table struct {
	mu     sync.RWMutex
	byName map[string][]netip.Addr // lower case, no trailing dot
	byAddr map[netip.Addr][]string
}

// NewTable returns an empty table.
func NewTable() *Table {
	return &Table{byName: map[string][]netip.Addr{}, byAddr: map[netip.Addr][]string{}}
}

// Set replaces the table with names (node ID → address). Entries whose
// address does not parse are left out.
func (t *Table) Set(names map[string]string) {
	byName := map[string][]netip.Addr{}
	byAddr := map[netip.Addr][]string{}
	for name, a := range names {
		addr, err := netip.ParseAddr(a)
		if err != nil || name == "" {
			continue
		}
		addr = addr.Unmap()
		name = strings.ToLower(strings.TrimSuffix(name, "."))
		byName[name] = append(byName[name], addr)
		byAddr[addr] = append(byAddr[addr], name)
	}
	t.mu.Lock()
	t.byName, t.byAddr = byName, byAddr
	t.mu.Unlock()
}

// Lookup returns the addresses of name and whether the table knows it.
func (t *Table) Lookup(name string) ([]netip.Addr, bool) {
	t.mu.RLock()
	defer t.mu.RUnlock()
	a, ok := t.byName[strings.ToLower(strings.TrimSuffix(name, "."))]
	return a, ok
}

// names returns the names of addr.
func (t *Table) names(addr netip.Addr) []string {
	t.mu.RLock()
	defer t.mu.RUnlock()
	return t.byAddr[addr.Unmap()]
}

// shadows reports whether name is <a known name>.<suffix>: what Go's
// resolver asks first for a node ID when resolv.conf has a search list.
// No real domain holds a node ID as its first label, and asking the
// network would tell it the cluster's node IDs and wait for its answer.
func (t *Table) shadows(name string) bool {
	first, rest, ok := strings.Cut(strings.TrimSuffix(name, "."), ".")
	if !ok || rest == "" {
		return false
	}
	_, known := t.Lookup(first)
	return known
}

// Resolver returns a resolver (Go's, PreferGo) that answers from the
// table and asks the nameserver Go chose for every other name. A process
// installs it as net.DefaultResolver before it resolves anything.
func (t *Table) Resolver() *net.Resolver {
	return &net.Resolver{PreferGo: true, Dial: t.dial}
}

// dial is the resolver's Dial: a conn that answers each query itself or
// forwards it (conn.go).
func (t *Table) dial(ctx context.Context, network, address string) (net.Conn, error) {
	return newConn(t, network, address), nil
}

// Install makes t's resolver the process's default (net.DefaultResolver),
// which net.Dial, gRPC and etcd use; call it before anything resolves.
func Install(t *Table) {
	net.DefaultResolver = t.Resolver()
}
