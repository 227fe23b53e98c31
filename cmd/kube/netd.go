package main

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"net"
	"os"
	"os/signal"
	"path/filepath"
	"sort"
	"syscall"
	"time"

	"github.com/vishvananda/netlink"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/tools/cache"
)

// runNetd is `kube netd`: the node's part of the pod network.
//
//	-pod-cidr (the curator's allocation) ─┐
//	node IPAM ── Node.spec.podCIDR ───────┴─► netd ──► CNI configuration (ptp + host-local
//	                                             │         over this node's pod CIDR)
//	other nodes' podCIDR + InternalIP ───────────┴──► routes podCIDR via node address
//
// Nodes share an L2 network, so a route per node is the whole pod
// network: no overlay, no encapsulation (WireGuard between nodes comes
// later). Routes netd made carry their own routing protocol number, so it
// removes exactly its own stale ones.
func runNetd(args []string) int {
	fs := flag.NewFlagSet("netd", flag.ContinueOnError)
	kubeconfig := fs.String("kubeconfig", "", "kubeconfig")
	node := fs.String("node", "", "this node's name")
	confDir := fs.String("cni-conf-dir", "", "where the CNI configuration goes")
	ipamDir := fs.String("ipam-dir", "", "host-local's state directory")
	podCIDR := fs.String("pod-cidr", "", "this node's pod CIDR, if known before its Node has one (the curator's allocation)")
	if err := fs.Parse(args); err != nil || *kubeconfig == "" || *node == "" || *confDir == "" || *ipamDir == "" {
		fmt.Fprintln(os.Stderr, "usage: kube netd -kubeconfig FILE -node NAME -cni-conf-dir DIR -ipam-dir DIR [-pod-cidr CIDR]")
		return 2
	}
	n := &netd{self: *node, confDir: *confDir, ipamDir: *ipamDir}
	// The pod network first, before reading the Node: the kubelet
	// reports its Node Ready only once the runtime has a CNI
	// configuration, and the node IPAM sets this same CIDR on the Node.
	if *podCIDR != "" {
		_, cidr, err := net.ParseCIDR(*podCIDR)
		if err == nil {
			err = n.writeCNI(cidr)
		}
		if err != nil {
			fmt.Fprintln(os.Stderr, "netd:", err)
			return 1
		}
	}
	cs, err := clientset(*kubeconfig)
	if err != nil {
		fmt.Fprintln(os.Stderr, "netd:", err)
		return 1
	}
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, syscall.SIGINT)
	defer stop()
	factory := informers.NewSharedInformerFactory(cs, 5*time.Minute)
	nodes := factory.Core().V1().Nodes()
	kick := make(chan struct{}, 1)
	poke := func(any) {
		select {
		case kick <- struct{}{}:
		default:
		}
	}
	nodes.Informer().AddEventHandler(cache.ResourceEventHandlerFuncs{
		AddFunc: poke, UpdateFunc: func(_, n any) { poke(n) }, DeleteFunc: poke,
	})
	factory.Start(ctx.Done())
	factory.WaitForCacheSync(ctx.Done())
	fmt.Println("netd: watching nodes")
	tick := time.NewTicker(time.Minute)
	defer tick.Stop()
	for {
		list, err := nodes.Lister().List(labels.Everything())
		if err == nil {
			err = n.reconcile(list)
		}
		if err != nil {
			fmt.Fprintln(os.Stderr, "netd:", err)
		}
		select {
		case <-ctx.Done():
			return 0
		case <-kick:
		case <-tick.C:
		}
	}
}

// routeProtocol marks netd's routes (any number the kernel does not use
// itself; 0x50 'P').
const routeProtocol = netlink.RouteProtocol(0x50)

type netd struct {
	self, confDir, ipamDir string
	written                string // pod CIDR of the configuration written
}

func (n *netd) reconcile(nodes []*corev1.Node) error {
	want := map[string]net.IP{}
	for _, node := range nodes {
		_, cidr, err := net.ParseCIDR(node.Spec.PodCIDR)
		if err != nil {
			continue
		}
		if node.Name == n.self {
			if err := n.writeCNI(cidr); err != nil {
				return err
			}
			continue
		}
		if ip := internalIP(node); ip != nil {
			want[cidr.String()] = ip
		}
	}
	return syncRoutes(want)
}

func internalIP(node *corev1.Node) net.IP {
	for _, a := range node.Status.Addresses {
		if a.Type == corev1.NodeInternalIP {
			if ip := net.ParseIP(a.Address).To4(); ip != nil {
				return ip
			}
		}
	}
	return nil
}

// syncRoutes makes netd's routes exactly want (pod CIDR → node address).
func syncRoutes(want map[string]net.IP) error {
	have, err := netlink.RouteListFiltered(netlink.FAMILY_V4, &netlink.Route{Protocol: routeProtocol}, netlink.RT_FILTER_PROTOCOL)
	if err != nil {
		return fmt.Errorf("listing routes: %w", err)
	}
	for _, r := range have {
		if gw, ok := want[r.Dst.String()]; !ok || !gw.Equal(r.Gw) {
			if err := netlink.RouteDel(&r); err != nil {
				return fmt.Errorf("removing route %s: %w", r.Dst, err)
			}
			fmt.Printf("netd: removed route %s via %s\n", r.Dst, r.Gw)
		}
	}
	keys := make([]string, 0, len(want))
	for k := range want {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	for _, k := range keys {
		_, dst, _ := net.ParseCIDR(k)
		r := &netlink.Route{Dst: dst, Gw: want[k], Protocol: routeProtocol}
		known := false
		for _, h := range have {
			known = known || (h.Dst.String() == k && h.Gw.Equal(want[k]))
		}
		if known {
			continue
		}
		if err := netlink.RouteReplace(r); err != nil {
			return fmt.Errorf("route %s via %s: %w", dst, want[k], err)
		}
		fmt.Printf("netd: route %s via %s\n", dst, want[k])
	}
	return nil
}

// writeCNI writes the CNI configuration for this node's pod CIDR (once;
// a Node's CIDR never changes, and the IPAM gives the Node the one
// -pod-cidr named).
func (n *netd) writeCNI(cidr *net.IPNet) error {
	if n.written == cidr.String() {
		return nil
	}
	conf := map[string]any{
		"cniVersion": "1.0.0",
		"name":       "plinth",
		"plugins": []any{map[string]any{
			"type":   "ptp",
			"ipMasq": false,
			"mtu":    1500,
			"ipam": map[string]any{
				"type":    "host-local",
				"ranges":  [][]map[string]string{{{"subnet": cidr.String()}}},
				"routes":  []map[string]string{{"dst": "0.0.0.0/0"}},
				"dataDir": n.ipamDir,
			},
		}, map[string]any{
			// A pod's hostPort: DNAT in nftables (table cni_hostport,
			// through the node's nft as kube-proxy's rules are), for
			// the node's addresses and, with route_localnet, 127.0.0.1.
			"type":         "portmap",
			"backend":      "nftables",
			"capabilities": map[string]bool{"portMappings": true},
		}},
	}
	b, err := json.MarshalIndent(conf, "", "  ")
	if err != nil {
		return err
	}
	if err := os.MkdirAll(n.confDir, 0o755); err != nil {
		return err
	}
	p := filepath.Join(n.confDir, "10-plinth.conflist")
	if err := os.WriteFile(p+".new", b, 0o644); err != nil {
		return err
	}
	if err := os.Rename(p+".new", p); err != nil {
		return err
	}
	n.written = cidr.String()
	fmt.Printf("netd: pod network %s configured in %s\n", cidr, p)
	return nil
}
