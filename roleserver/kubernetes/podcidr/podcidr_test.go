package kubernetes

import "testing"

func TestFreeCIDR(t *testing.T) {
	a := podCIDRs{Nodes: map[string]string{"a": "10.244.0.0/24", "b": "10.244.2.0/24"}}
	if c, err := freeCIDR("10.244.0.0/16", 24, a); err != nil || c != "10.244.1.0/24" {
		t.Errorf("got %q, %v; want the gap 10.244.1.0/24", c, err)
	}
	full := podCIDRs{Nodes: map[string]string{"a": "10.0.0.0/25", "b": "10.0.0.128/25"}}
	if c, err := freeCIDR("10.0.0.0/24", 25, full); err == nil {
		t.Errorf("a full range gave %q", c)
	}
	for _, bad := range []struct {
		cluster string
		size    int
	}{{"10.0.0.0/24", 16}, {"fd00::/64", 80}, {"nonsense", 24}} {
		if c, err := freeCIDR(bad.cluster, bad.size, podCIDRs{}); err == nil {
			t.Errorf("%s /%d: %q, no error", bad.cluster, bad.size, c)
		}
	}
}
