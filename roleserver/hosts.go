package roleserver

import (
	"bufio"
	"bytes"
	"fmt"
	"net"
	"slices"
	"strings"
	"sync"

	"plinth.dev/plinth/platform/nodenames"
	"plinth.dev/plinth/roleserver/localstorage"
)

// hostsFile is the node's map of node IDs to addresses: every node ID of
// the cluster at its address, and this node at its own. It lives in
// Names (the resolver's table: platform/nodenames) and in a cache on
// /data for a cold start; never in /etc/hosts, which pods may mount.
// The hosts worker sets the nodes; the control plane refreshes the map
// before etcd starts.
type hostsFile struct {
	names     *nodenames.Table   // Config.Names
	root      *localstorage.Root // the cache, root.Data.Node.Hosts
	addresses func() []string    // the node's addresses, most preferred first

	mu      sync.Mutex
	loaded  bool
	nodes   map[string]string // node ID → address, from the curator or the cache
	written []byte            // last content put into names and the cache
}

// known is how many nodes are known (from the curator or the cache).
func (h *hostsFile) known() int {
	h.mu.Lock()
	defer h.mu.Unlock()
	return len(h.nodes)
}

// setNodes replaces the node map; it reports whether it changed.
func (h *hostsFile) setNodes(nodes map[string]string) bool {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.loaded = true
	if mapsEqual(h.nodes, nodes) {
		return false
	}
	h.nodes = nodes
	return true
}

func mapsEqual(a, b map[string]string) bool {
	if len(a) != len(b) {
		return false
	}
	for k, v := range a {
		if w, ok := b[k]; !ok || w != v {
			return false
		}
	}
	return true
}

// refresh sets Names and writes the cache if their content changed: the
// known nodes plus this node (self) at its current address.
func (h *hostsFile) refresh(self string) error {
	h.mu.Lock()
	defer h.mu.Unlock()
	cache := &h.root.Data.Node.Hosts
	if !h.loaded {
		h.loaded = true
		if b, err := cache.Read(); err == nil {
			h.nodes = parseHosts(b)
		}
	}
	own := "127.0.0.1"
	if a := h.addresses(); len(a) > 0 {
		own = a[0]
	}
	content := renderHosts(h.nodes, self, own)
	if bytes.Equal(content, h.written) {
		return nil
	}
	h.names.Set(parseHosts(content))
	h.written = content
	if err := localstorage.Create(&h.root.Data.Node, 0o700); err != nil {
		return err
	}
	return cache.Write(content, 0o644)
}

const hostsHeader = "# The Plinth Role Server's cache: cluster nodes by node ID.\n"

// renderHosts is a hosts file: localhost, self at own, then the other
// nodes sorted by ID.
func renderHosts(nodes map[string]string, self, own string) []byte {
	var b bytes.Buffer
	b.WriteString(hostsHeader)
	b.WriteString("127.0.0.1\tlocalhost\n::1\tlocalhost\n")
	if self != "" {
		fmt.Fprintf(&b, "%s\t%s\n", own, self)
	}
	ids := make([]string, 0, len(nodes))
	for id := range nodes {
		if id != self && id != "localhost" && net.ParseIP(nodes[id]) != nil {
			ids = append(ids, id)
		}
	}
	slices.Sort(ids)
	for _, id := range ids {
		fmt.Fprintf(&b, "%s\t%s\n", nodes[id], id)
	}
	return b.Bytes()
}

// parseHosts reads back renderHosts' node lines (all but localhost).
func parseHosts(b []byte) map[string]string {
	out := map[string]string{}
	sc := bufio.NewScanner(bytes.NewReader(b))
	for sc.Scan() {
		line := strings.TrimSpace(sc.Text())
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		f := strings.Fields(line)
		if len(f) < 2 || f[1] == "localhost" || net.ParseIP(f[0]) == nil {
			continue
		}
		out[f[1]] = f[0]
	}
	return out
}
