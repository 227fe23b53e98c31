package netpol

import (
	"context"
	"fmt"
	"net/netip"
	"time"

	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/cache"
	"sigs.k8s.io/knftables"
)

// Controller keeps the node's table in step with the cluster's
// policies, pods and namespaces.
type Controller struct {
	Client kubernetes.Interface
	// Node is this node's name: its pods' policies are enforced here.
	Node string
	// NFT is the table's interface (knftables.New(knftables.InetFamily,
	// Table); a fake in tests).
	NFT knftables.Interface
	// Log says what the controller does (nil: nothing).
	Log func(format string, args ...any)

	written   string    // the last transaction run (its text)
	writtenAt time.Time // when
}

// rewriteAfter is how old the table may be before a change that leaves
// it as it is writes it again all the same. Most changes do leave it:
// every pod's status in the cluster is one (the pods are watched for
// their addresses and labels), and under load that is several a
// second; each write runs nft, a process, which costs a TCG node tens of
// milliseconds of CPU. Writing an unchanged table again now and then
// puts it back should anything else have altered it.
const rewriteAfter = 5 * time.Minute

// settle is how long the controller waits after a change for more
// before it writes the table (a Deployment's pods come in a burst).
const settle = 200 * time.Millisecond

// Run writes the table after the caches sync and after every change,
// until ctx ends; it removes the table as it ends (the pods are then
// unfiltered, as on a node without policies, rather than cut off by a
// stale table).
func (c *Controller) Run(ctx context.Context) error {
	if c.Log == nil {
		c.Log = func(string, ...any) {}
	}
	c.written = "" // a Run ends by removing the table: the next writes it anew
	factory := informers.NewSharedInformerFactory(c.Client, 10*time.Minute)
	pods := factory.Core().V1().Pods()
	namespaces := factory.Core().V1().Namespaces()
	policies := factory.Networking().V1().NetworkPolicies()
	changed := make(chan struct{}, 1)
	poke := func(any) {
		select {
		case changed <- struct{}{}:
		default:
		}
	}
	for _, inf := range []cache.SharedIndexInformer{pods.Informer(), namespaces.Informer(), policies.Informer()} {
		if _, err := inf.AddEventHandler(cache.ResourceEventHandlerFuncs{
			AddFunc: poke, UpdateFunc: func(_, o any) { poke(o) }, DeleteFunc: poke,
		}); err != nil {
			return err
		}
	}
	factory.Start(ctx.Done())
	defer factory.Shutdown()
	for typ, ok := range factory.WaitForCacheSync(ctx.Done()) {
		if !ok {
			return fmt.Errorf("network policies: the %v cache did not sync: %w", typ, ctx.Err())
		}
	}
	defer c.remove()
	for {
		if err := c.sync(ctx, pods.Lister().List, namespaces.Lister().List, policies.Lister().List); err != nil {
			c.Log("writing the network policy table (retried): %v", err)
			select {
			case <-ctx.Done():
				return ctx.Err()
			case <-time.After(5 * time.Second):
			}
			continue
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-changed:
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(settle):
		}
	}
}

// sync compiles what the listers hold and writes the table.
func (c *Controller) sync(ctx context.Context, listPods func(labels.Selector) ([]*corev1.Pod, error),
	listNamespaces func(labels.Selector) ([]*corev1.Namespace, error), listPolicies func(labels.Selector) ([]*networkingv1.NetworkPolicy, error)) error {
	ps, err := listPods(labels.Everything())
	if err != nil {
		return err
	}
	nss, err := listNamespaces(labels.Everything())
	if err != nil {
		return err
	}
	pols, err := listPolicies(labels.Everything())
	if err != nil {
		return err
	}
	namespaces := map[string]map[string]string{}
	for _, ns := range nss {
		namespaces[ns.Name] = ns.Labels
	}
	rs := Compile(pols, PodsOf(ps, c.Node), namespaces)
	tx := c.NFT.NewTransaction()
	rs.Write(tx)
	text := tx.String()
	if text == c.written && time.Since(c.writtenAt) < rewriteAfter {
		return nil
	}
	if err := c.NFT.Run(ctx, tx); err != nil {
		return err
	}
	c.written, c.writtenAt = text, time.Now()
	c.Log("network policy table written: %d policies, %d pods of this node isolated for ingress, %d for egress", len(pols), len(rs.ingress), len(rs.egress))
	return nil
}

// remove deletes the table.
func (c *Controller) remove() {
	tx := c.NFT.NewTransaction()
	tx.Add(&knftables.Table{})
	tx.Delete(&knftables.Table{})
	if err := c.NFT.Run(context.Background(), tx); err != nil {
		c.Log("removing the network policy table: %v", err)
	}
}

// PodsOf is what Compile needs of the pods: those with a pod network
// address (not the host's), Local if on node.
func PodsOf(pods []*corev1.Pod, node string) []Pod {
	var out []Pod
	for _, p := range pods {
		ip, err := netip.ParseAddr(p.Status.PodIP)
		if err != nil || p.Spec.HostNetwork || p.Status.Phase == corev1.PodSucceeded || p.Status.Phase == corev1.PodFailed {
			continue
		}
		pod := Pod{Namespace: p.Namespace, Name: p.Name, Labels: p.Labels, IP: ip, Local: p.Spec.NodeName == node}
		for _, ctr := range p.Spec.Containers {
			for _, port := range ctr.Ports {
				if port.Name != "" {
					proto := port.Protocol
					if proto == "" {
						proto = corev1.ProtocolTCP
					}
					pod.Ports = append(pod.Ports, NamedPort{Name: port.Name, Protocol: proto, Port: port.ContainerPort})
				}
			}
		}
		out = append(out, pod)
	}
	return out
}
