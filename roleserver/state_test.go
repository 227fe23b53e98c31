package roleserver

import (
	"strings"
	"testing"
)

// TestCuratorEndpoints: the resolver's endpoints are the local curator,
// the cluster's consensus members, then the parameters' fallback, without
// duplicates — and never a decommissioned node's address, whichever list
// names it.
func TestCuratorEndpoints(t *testing.T) {
	e := curatorEndpoints{
		local:     "127.0.0.1:7835",
		directory: []string{"10.42.0.11:7835", "10.42.0.12:7835"},
		fallback:  []string{"10.42.0.10:7835", "10.42.0.11:7835", "10.42.0.13:7835"},
		former:    map[string]bool{"10.42.0.10": true, "10.42.0.12": true},
	}
	got := e.list()
	want := []string{"127.0.0.1:7835", "10.42.0.11:7835", "10.42.0.13:7835"}
	if strings.Join(got, ",") != strings.Join(want, ",") {
		t.Fatalf("endpoints %v, want %v", got, want)
	}
}
