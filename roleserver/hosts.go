package roleserver

import (
	"bufio"
	"bytes"
	"context"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"time"

	"google.golang.org/protobuf/proto"

	"plinth.dev/plinth/api/clusterpb"
	"plinth.dev/plinth/platform/atomicfile"
	"plinth.dev/plinth/platform/supervisor"
	"plinth.dev/plinth/roleserver/localstorage"
)

// hostsState is what the hosts file is made of.
type hostsState struct {
	loaded  bool
	nodes   map[string]string // node ID → address, from the curator or the cache
	written []byte            // last content written to HostsPath
}

// hostsRefresh is how often the hosts worker picks up a changed own
// address.
const hostsRefresh = 5 * time.Second

// runHosts keeps HostsPath (and its cache on /data) mapping every node ID
// of the cluster to its address, so etcd peer URLs https://<node ID>:7834
// resolve, also on a cold start before any curator is reachable. It also
// makes every consensus member's curator an endpoint of the resolver.
func (s *Service) runHosts(ctx context.Context) error {
	log := supervisor.Logger(ctx)
	nd, err := wait(ctx, &s.node)
	if err != nil {
		return err
	}
	if err := s.refreshHosts(nd.nodeID); err != nil {
		log.Warn("writing hosts file", "err", err)
	} else if n := s.knownHosts(); n > 0 {
		log.Info("hosts file restored from cache", "nodes", n)
	}
	go func() {
		for sleep(ctx, hostsRefresh) == nil {
			if err := s.refreshHosts(nd.nodeID); err != nil {
				log.Warn("writing hosts file", "err", err)
			}
		}
	}()
	conn, err := wait(ctx, &s.CuratorConnection)
	if err != nil {
		return err
	}
	supervisor.Signal(ctx, supervisor.SignalHealthy)
	var b backoff
	for {
		err := s.watchAllNodes(ctx, conn, nd.nodeID, &b)
		if ctx.Err() != nil {
			return ctx.Err()
		}
		log.Warn("watching the cluster's nodes failed, retrying", "err", err)
		if err := sleep(ctx, b.next()); err != nil {
			return err
		}
	}
}

func (s *Service) watchAllNodes(ctx context.Context, conn *CuratorConnection, self string, b *backoff) error {
	log := supervisor.Logger(ctx)
	stream, err := conn.Curator().Watch(ctx, &clusterpb.WatchRequest{
		Kind: &clusterpb.WatchRequest_NodesInCluster_{NodesInCluster: &clusterpb.WatchRequest_NodesInCluster{}},
	})
	if err != nil {
		return err
	}
	nodes := map[string]*clusterpb.Node{}
	backlogged := false
	for {
		ev, err := stream.Recv()
		if err != nil {
			return err
		}
		b.reset()
		for _, n := range ev.GetNodes() {
			nodes[n.GetId()] = n
		}
		for _, t := range ev.GetTombstones() {
			delete(nodes, t.GetNodeId())
		}
		if ev.GetProgress() == clusterpb.WatchEvent_PROGRESS_LAST_BACKLOGGED {
			backlogged = true
		}
		if !backlogged {
			continue // only the full picture may drop entries
		}
		addrs := map[string]string{}
		dir := &clusterpb.ClusterDirectory{}
		former := map[string]bool{}
		var curators []string
		for id, n := range nodes {
			a := n.GetStatus().GetAddresses()
			if n.GetState() == clusterpb.NodeState_NODE_STATE_DECOMMISSIONED {
				for _, addr := range a {
					former[addr] = true
				}
				continue
			}
			if len(a) > 0 {
				addrs[id] = a[0]
				if n.GetRoles().GetConsensusMember() != nil {
					dir.Nodes = append(dir.Nodes, &clusterpb.DirectoryNode{Id: id, PublicKey: n.GetPublicKey(), Addresses: a})
					if id != self {
						curators = append(curators, net.JoinHostPort(a[0], strconv.Itoa(s.curatorPort())))
					}
				}
			}
		}
		// A decommissioned node's address is an endpoint no more, also
		// where the node parameters name it.
		for _, addr := range addrs {
			delete(former, addr) // an address now used by a live node
		}
		slices.Sort(curators)
		apis := apiServerAddresses(nodes)
		slices.Sort(apis)
		if cur := current(&s.kubernetesControllers); !slices.Equal(cur, apis) {
			s.kubernetesControllers.Set(apis)
		}
		s.setEndpoints(conn.Resolver, func(e *curatorEndpoints) {
			e.directory, e.former = curators, former
		})
		s.directoryChanged(ctx, dir)
		changed := s.setHostsNodes(addrs)
		if err := s.refreshHosts(self); err != nil {
			log.Warn("writing hosts file", "err", err)
		} else if changed {
			log.Info("hosts file updated", "nodes", len(addrs))
		}
	}
}

// directoryChanged hands the curators' current directory to
// Config.DirectoryChanged when it differs from the last one handed over,
// so that the node finds the cluster after a reboot even when the
// curators it registered with have moved.
func (s *Service) directoryChanged(ctx context.Context, dir *clusterpb.ClusterDirectory) {
	if s.DirectoryChanged == nil || len(dir.GetNodes()) == 0 {
		return
	}
	slices.SortFunc(dir.Nodes, func(a, b *clusterpb.DirectoryNode) int { return strings.Compare(a.Id, b.Id) })
	s.mu.Lock()
	same := proto.Equal(s.lastDirectory, dir)
	s.mu.Unlock()
	if same {
		return
	}
	if err := s.DirectoryChanged(dir); err != nil {
		supervisor.Logger(ctx).Warn("saving the cluster directory", "err", err)
		return
	}
	s.mu.Lock()
	s.lastDirectory = dir
	s.mu.Unlock()
}

func (s *Service) knownHosts() int {
	s.hostsMu.Lock()
	defer s.hostsMu.Unlock()
	return len(s.hosts.nodes)
}

// setHostsNodes replaces the node map; it reports whether it changed.
func (s *Service) setHostsNodes(nodes map[string]string) bool {
	s.hostsMu.Lock()
	defer s.hostsMu.Unlock()
	s.hosts.loaded = true
	if mapsEqual(s.hosts.nodes, nodes) {
		return false
	}
	s.hosts.nodes = nodes
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

// refreshHosts writes HostsPath and the cache if their content changed:
// the known nodes plus this node (self) at its current address.
func (s *Service) refreshHosts(self string) error {
	s.hostsMu.Lock()
	defer s.hostsMu.Unlock()
	cache := &s.StorageRoot.Data.Node.Hosts
	if !s.hosts.loaded {
		s.hosts.loaded = true
		if b, err := cache.Read(); err == nil {
			s.hosts.nodes = parseHosts(b)
		}
	}
	own := "127.0.0.1"
	if a := s.addresses(); len(a) > 0 {
		own = a[0]
	}
	content := renderHosts(s.hosts.nodes, self, own)
	if bytes.Equal(content, s.hosts.written) {
		return nil
	}
	if err := writeHosts(s.HostsPath, content); err != nil {
		return err
	}
	s.hosts.written = content
	if err := localstorage.Create(&s.StorageRoot.Data.Node, 0o700); err != nil {
		return err
	}
	return cache.Write(content, 0o644)
}

const hostsHeader = "# Written by the Plinth Role Server: cluster nodes by node ID.\n"

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

// writeHosts replaces a hosts file (0644), creating its directory.
func writeHosts(path string, data []byte) error {
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		return err
	}
	return atomicfile.Write(path, data, 0o644)
}
