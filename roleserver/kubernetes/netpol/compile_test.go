package netpol

import (
	"context"
	"flag"
	"net/netip"
	"os"
	"os/exec"
	"slices"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
	"sigs.k8s.io/knftables"
)

var update = flag.Bool("update", false, "rewrite testdata/ruleset.nft")

func ptr[T any](v T) *T { return &v }

// testCluster: namespace app (team a) with pods web (local, a named port
// http) and db (local), client (another node's), and namespace other
// (team b) with pod stranger.
func testCluster() ([]Pod, map[string]map[string]string) {
	pods := []Pod{
		{Namespace: "app", Name: "web", Labels: map[string]string{"app": "web"}, IP: netip.MustParseAddr("10.244.1.10"), Local: true,
			Ports: []NamedPort{{"http", corev1.ProtocolTCP, 8080}}},
		{Namespace: "app", Name: "db", Labels: map[string]string{"app": "db"}, IP: netip.MustParseAddr("10.244.1.11"), Local: true},
		{Namespace: "app", Name: "client", Labels: map[string]string{"app": "client"}, IP: netip.MustParseAddr("10.244.2.20")},
		{Namespace: "other", Name: "stranger", Labels: map[string]string{"app": "client"}, IP: netip.MustParseAddr("10.244.2.30"),
			Ports: []NamedPort{{"http", corev1.ProtocolTCP, 9090}}},
	}
	return pods, map[string]map[string]string{"app": {"team": "a"}, "other": {"team": "b"}}
}

func testPolicies() []*networkingv1.NetworkPolicy {
	tcp, udp := corev1.ProtocolTCP, corev1.ProtocolUDP
	return []*networkingv1.NetworkPolicy{
		// Default deny of ingress in app.
		{ObjectMeta: metav1.ObjectMeta{Namespace: "app", Name: "deny"}, Spec: networkingv1.NetworkPolicySpec{
			PolicyTypes: []networkingv1.PolicyType{networkingv1.PolicyTypeIngress}}},
		// web: from app's clients, to its named port http; from team b
		// on 9000-9100.
		{ObjectMeta: metav1.ObjectMeta{Namespace: "app", Name: "web"}, Spec: networkingv1.NetworkPolicySpec{
			PodSelector: metav1.LabelSelector{MatchLabels: map[string]string{"app": "web"}},
			Ingress: []networkingv1.NetworkPolicyIngressRule{
				{From: []networkingv1.NetworkPolicyPeer{{PodSelector: &metav1.LabelSelector{MatchLabels: map[string]string{"app": "client"}}}},
					Ports: []networkingv1.NetworkPolicyPort{{Protocol: &tcp, Port: ptr(intstr.FromString("http"))}}},
				{From: []networkingv1.NetworkPolicyPeer{{NamespaceSelector: &metav1.LabelSelector{MatchLabels: map[string]string{"team": "b"}}}},
					Ports: []networkingv1.NetworkPolicyPort{{Protocol: &tcp, Port: ptr(intstr.FromInt32(9000)), EndPort: ptr(int32(9100))}}},
			}}},
		// db: egress to 10/8 but the pod network on DNS, and to team b's
		// pods on their named port http.
		{ObjectMeta: metav1.ObjectMeta{Namespace: "app", Name: "db-egress"}, Spec: networkingv1.NetworkPolicySpec{
			PodSelector: metav1.LabelSelector{MatchLabels: map[string]string{"app": "db"}},
			PolicyTypes: []networkingv1.PolicyType{networkingv1.PolicyTypeEgress},
			Egress: []networkingv1.NetworkPolicyEgressRule{
				{To: []networkingv1.NetworkPolicyPeer{{IPBlock: &networkingv1.IPBlock{CIDR: "10.0.0.0/8", Except: []string{"10.244.0.0/16"}}}},
					Ports: []networkingv1.NetworkPolicyPort{{Protocol: &udp, Port: ptr(intstr.FromInt32(53))}}},
				{To: []networkingv1.NetworkPolicyPeer{{NamespaceSelector: &metav1.LabelSelector{MatchLabels: map[string]string{"team": "b"}}}},
					Ports: []networkingv1.NetworkPolicyPort{{Protocol: &tcp, Port: ptr(intstr.FromString("http"))}}},
			}}},
		// In another namespace: selects nothing here.
		{ObjectMeta: metav1.ObjectMeta{Namespace: "other", Name: "deny"}, Spec: networkingv1.NetworkPolicySpec{
			PolicyTypes: []networkingv1.PolicyType{networkingv1.PolicyTypeIngress, networkingv1.PolicyTypeEgress}}},
	}
}

// TestCompile: the ruleset of testPolicies on testCluster, as nft reads
// it (golden: testdata/ruleset.nft; -update rewrites it), is accepted by
// knftables' fake (every set and chain a rule names exists), and says
// what the policies say.
func TestCompile(t *testing.T) {
	pods, namespaces := testCluster()
	rs := Compile(testPolicies(), pods, namespaces)
	fake := knftables.NewFake(knftables.InetFamily, Table)
	tx := fake.NewTransaction()
	rs.Write(tx)
	if err := fake.Run(context.Background(), tx); err != nil {
		t.Fatalf("the ruleset: %v\n%s", err, tx)
	}
	dump := fake.Dump()
	if *update {
		if err := os.WriteFile("testdata/ruleset.nft", []byte(dump), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	golden, err := os.ReadFile("testdata/ruleset.nft")
	if err != nil || string(golden) != dump {
		t.Errorf("the ruleset differs from testdata/ruleset.nft (%v):\n%s", err, dump)
	}
	// The kernel's nftables accepts it as nft reads it (check mode:
	// nothing is changed; nft is what the node carries, from the same
	// Debian package).
	nft, err := exec.LookPath("nft")
	if err != nil {
		nft = "/usr/sbin/nft" // outside a root's PATH; make's install-deps installs it
	}
	check := exec.Command(nft, "-c", "-f", "-")
	check.Stdin = strings.NewReader(dump)
	if out, err := check.CombinedOutput(); err != nil {
		t.Errorf("nft -c refuses the ruleset: %v\n%s", err, out)
	}

	web, db := "in-"+hash("app/web"), "eg-"+hash("app/db")
	// web: isolated for ingress (by both app policies), not for egress.
	if rs.ingress["10.244.1.10"] != web || rs.egress["10.244.1.10"] != "" {
		t.Errorf("web's chains: ingress %q, egress %q", rs.ingress["10.244.1.10"], rs.egress["10.244.1.10"])
	}
	webRules := rs.chains[web]
	set0, set1 := "in-"+hash("app/web")+"-0", "in-"+hash("app/web")+"-1"
	for _, want := range []string{
		"ip saddr @" + set0 + " meta l4proto . th dport { tcp . 8080 } return",
		"ip saddr @" + set1 + " meta l4proto . th dport { tcp . 9000-9100 } return",
	} {
		if !slices.Contains(webRules, want) {
			t.Errorf("web's ingress chain lacks %q: %q", want, webRules)
		}
	}
	if webRules[len(webRules)-1] != "drop" {
		t.Errorf("web's ingress chain does not end in drop: %q", webRules)
	}
	if !slices.Equal(rs.sets[set0], []string{"10.244.2.20"}) || !slices.Equal(rs.sets[set1], []string{"10.244.2.30"}) {
		t.Errorf("web's peers: %q (want client), %q (want stranger)", rs.sets[set0], rs.sets[set1])
	}
	// db: the default deny isolates its ingress with no rule; its egress
	// allows 10/8 less the pod network, and stranger's named port.
	if rs.chains[rs.ingress["10.244.1.11"]][0] != "drop" {
		t.Errorf("db's ingress chain: %q", rs.chains[rs.ingress["10.244.1.11"]])
	}
	if blk := rs.sets["eg-"+hash("app/db-egress")+"-0"]; !slices.Equal(blk, []string{"10.0.0.0-10.243.255.255", "10.245.0.0-10.255.255.255"}) {
		t.Errorf("10.0.0.0/8 except 10.244.0.0/16: %q", blk)
	}
	if !slices.Contains(rs.chains[db], "ip daddr . meta l4proto . th dport { 10.244.2.30 . tcp . 9090 } return") {
		t.Errorf("db's egress chain lacks stranger's named port: %q", rs.chains[db])
	}
	// Pods of other nodes get no chains here; other's policy selects
	// none of this node's pods.
	for ip := range rs.ingress {
		if !strings.HasPrefix(ip, "10.244.1.") {
			t.Errorf("a chain for %s, not on this node", ip)
		}
	}
}
