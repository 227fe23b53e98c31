//go:build built

package vmtest

import (
	"context"
	"net/netip"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"plinth.dev/plinth/launch"
)

// TestNodesShareL2Network boots two nodes on one harness switch: both
// get their addresses from the switch's DHCP server, over QEMU dgram
// sockets, without root.
func TestNodesShareL2Network(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*bootTimeout)
	defer cancel()
	dir, err := os.MkdirTemp("", "psw")
	if err != nil {
		t.Fatal(err)
	}
	defer os.RemoveAll(dir)
	sw, err := launch.NewSwitch(dir, netip.MustParsePrefix("10.42.0.0/24"))
	if err != nil {
		t.Fatal(err)
	}
	defer sw.Close()

	base := testDir(t)
	addrs := map[string]bool{}
	for _, name := range []string{"a", "b"} {
		args, err := sw.Port(name)
		if err != nil {
			t.Fatal(err)
		}
		m := newMachineIn(t, filepath.Join(base, name), launch.BootstrapParameters())
		n := m.boot(t, ctx, "node-"+name, func(o *launch.NodeOptions) {
			o.NoNetwork = true
			o.ExtraArgs = append(o.ExtraArgs, args...)
		})
		addr := mustLine(t, ctx, n, `I root.network: configured address .*address=(10\.42\.0\.\d+)/24 gateway=10\.42\.0\.1`)[1]
		addrs[addr] = true
		t.Cleanup(func() { n.Kill() })
	}
	if len(addrs) != 2 {
		t.Errorf("two nodes, addresses %v", addrs)
	}
	leases := sw.Leases()
	if len(leases) != 2 {
		t.Fatalf("switch leases %v", leases)
	}
	for _, a := range leases {
		if !addrs[a.String()] {
			t.Errorf("lease %s not configured by a node (%v)", a, addrs)
		}
	}
	t.Logf("nodes on the harness switch: %s", strings.Join(keys(addrs), ", "))
}

func keys(m map[string]bool) []string {
	var out []string
	for k := range m {
		out = append(out, k)
	}
	return out
}
