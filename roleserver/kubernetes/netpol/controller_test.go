package netpol

import (
	"context"
	"errors"
	"strings"
	"sync"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes/fake"
	"sigs.k8s.io/knftables"
)

// TestController: the table follows the API (a policy added isolates
// the local pod it selects, its removal lifts that; another node's pod
// and a host-network pod get no chain) and goes when the controller
// stops.
func TestController(t *testing.T) {
	pod := func(name, node, ip string, host bool) *corev1.Pod {
		return &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: "app", Name: name, Labels: map[string]string{"app": name}},
			Spec: corev1.PodSpec{NodeName: node, HostNetwork: host}, Status: corev1.PodStatus{PodIP: ip, Phase: corev1.PodRunning}}
	}
	client := fake.NewClientset(&corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: "app"}},
		pod("web", "n1", "10.244.1.10", false), pod("far", "n2", "10.244.2.10", false), pod("host", "n1", "10.0.2.15", true))
	nft := &countingNFT{Fake: knftables.NewFake(knftables.InetFamily, Table)}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- (&Controller{Client: client, Node: "n1", NFT: nft, Log: t.Logf}).Run(ctx) }()
	until := func(what string, ok func(dump string) bool) {
		t.Helper()
		for deadline := time.Now().Add(20 * time.Second); !ok(nft.Dump()); time.Sleep(20 * time.Millisecond) {
			if time.Now().After(deadline) {
				t.Fatalf("%s:\n%s", what, nft.Dump())
			}
		}
	}
	until("the table written", func(d string) bool { return strings.Contains(d, "add map inet plinth-netpol ingress") })
	// A change that leaves the table as it is (another node's pod,
	// without policies) does not write it again.
	writes := nft.count()
	far, err := client.CoreV1().Pods("app").Get(ctx, "far", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	far.Labels["version"] = "2"
	if _, err := client.CoreV1().Pods("app").Update(ctx, far, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	time.Sleep(5 * settle)
	if n := nft.count(); n != writes {
		t.Errorf("an unchanged table written again: %d writes, then %d", writes, n)
	}
	if _, err := client.NetworkingV1().NetworkPolicies("app").Create(ctx, &networkingv1.NetworkPolicy{
		ObjectMeta: metav1.ObjectMeta{Namespace: "app", Name: "deny"}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	until("web isolated", func(d string) bool { return strings.Contains(d, "ingress { 10.244.1.10 : jump in-") })
	if d := nft.Dump(); strings.Contains(d, "10.244.2.10 :") || strings.Contains(d, "10.0.2.15") {
		t.Errorf("a chain for another node's or a host-network pod:\n%s", d)
	}
	if err := client.NetworkingV1().NetworkPolicies("app").Delete(ctx, "deny", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	until("web open again", func(d string) bool { return !strings.Contains(d, "10.244.1.10") })
	cancel()
	if err := <-done; !errors.Is(err, context.Canceled) {
		t.Errorf("Run: %v", err)
	}
	if d := nft.Dump(); d != "" {
		t.Errorf("the table after the controller stopped:\n%s", d)
	}
}

// countingNFT counts the transactions run.
type countingNFT struct {
	*knftables.Fake
	mu   sync.Mutex
	runs int
}

func (n *countingNFT) Run(ctx context.Context, tx *knftables.Transaction) error {
	n.mu.Lock()
	n.runs++
	n.mu.Unlock()
	return n.Fake.Run(ctx, tx)
}

func (n *countingNFT) count() int {
	n.mu.Lock()
	defer n.mu.Unlock()
	return n.runs
}
