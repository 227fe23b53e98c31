package main

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"plinth.dev/plinth/api/nodepb"
	"plinth.dev/plinth/platform/pki"
	"plinth.dev/plinth/roleserver/parameters"
	"plinth.dev/plinth/vmtest"
)

// TestNetbootParameters: build -params takes a cluster's register
// parameters into the network-boot UKI's command line, and refuses
// parameters that would make every booting node the same node, or a new
// cluster.
func TestNetbootParameters(t *testing.T) {
	ca, err := pki.NewCA("cluster", 0)
	if err != nil {
		t.Fatal(err)
	}
	reg := &nodepb.Parameters{Cluster: &nodepb.Parameters_Register{Register: &nodepb.Register{
		ClusterCaCertificate: ca.Certificate.Raw, RegisterTicket: []byte{0, 1, 2}, CuratorEndpoints: []string{"10.42.0.10:7835"}}}}
	named := &nodepb.Parameters{Cluster: reg.Cluster, Network: &nodepb.Network{Hostname: "one"}}
	dir := t.TempDir()
	write := func(name string, p *nodepb.Parameters) string {
		raw, err := parameters.Encode(p)
		if err != nil {
			t.Fatal(err)
		}
		f := filepath.Join(dir, name)
		os.WriteFile(f, raw, 0o644)
		return f
	}
	arg, err := netbootParameters(write("reg.pb", reg))
	raw, _ := parameters.Encode(reg)
	if err != nil || arg != parameters.CmdlineKey+"="+parameters.CmdlineValue(raw) {
		t.Fatalf("register parameters: %q, %v", arg, err)
	}
	for name, p := range map[string]*nodepb.Parameters{"bootstrap": vmtest.BootstrapParameters(), "hostname": named} {
		if _, err := netbootParameters(write(name+".pb", p)); err == nil || !strings.Contains(err.Error(), "-params") {
			t.Errorf("%s parameters: %v", name, err)
		}
	}
	os.WriteFile(filepath.Join(dir, "garbage.pb"), []byte("\xff"), 0o644)
	if _, err := netbootParameters(filepath.Join(dir, "garbage.pb")); err == nil {
		t.Error("garbage accepted")
	}
}
