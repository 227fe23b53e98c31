package main

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"plinth.dev/plinth/api/nodepb"
	"plinth.dev/plinth/board"
	"plinth.dev/plinth/launch"
	"plinth.dev/plinth/platform/pki"
	"plinth.dev/plinth/roleserver/parameters"
)

// TestNetbootParameters: build --params takes a cluster's register
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
	for name, p := range map[string]*nodepb.Parameters{"bootstrap": launch.BootstrapParameters(), "hostname": named} {
		if _, err := netbootParameters(write(name+".pb", p)); err == nil || !strings.Contains(err.Error(), "--params") {
			t.Errorf("%s parameters: %v", name, err)
		}
	}
	os.WriteFile(filepath.Join(dir, "garbage.pb"), []byte("\xff"), 0o644)
	if _, err := netbootParameters(filepath.Join(dir, "garbage.pb")); err == nil {
		t.Error("garbage accepted")
	}
}

// TestBuildUsage: wrong usage of build and fetch-kernel exits 2 before
// anything is read, fetched or built; shared parameters that would make
// every booting node the same exit 1, also before anything is built.
func TestBuildUsage(t *testing.T) {
	dir := t.TempDir()
	boot := filepath.Join(dir, "boot.pb")
	ctl(t, "params", boot, "--bootstrap")
	checkExits(t, []exitCase{
		{[]string{"build", "--bin", dir}, 2, "--init is required"},
		{[]string{"build", "--init", "x"}, 2, "--bin is required"},
		{[]string{"build", "--init", "x", "--bin", dir, "--sign-key", "k"}, 2, "--sign-key needs --release N"},
		{[]string{"build", "--init", "x", "--bin", dir, "--board", "nope"}, 2, `unknown board "nope"`},
		{[]string{"build", "--init", "x", "--bin", dir, "--oci-archive", "=ref"}, 2, "oci-archive"},
		{[]string{"build", "--init", "x", "--bin", dir, "stray"}, 2, "unexpected arguments"},
		{[]string{"build", "--init", "x", "--bin", dir, "-o", "json"}, 2, "prints no object"},
		{[]string{"build", "--init", "x", "--bin", dir, "--params", boot}, 1, "must register with a cluster"},
		{[]string{"fetch-kernel", "--board", "nope"}, 2, `unknown board "nope"`},
		{[]string{"fetch-kernel", "stray"}, 2, "unexpected arguments"},
	})
	if got := files(t, dir); got != "boot.pb owner.key owner.pub" {
		t.Errorf("refused builds left files: %s", got)
	}
}

// TestOutDirDefaults: the directories build, fetch-kernel, run and
// launch default to are under OUT, the parent of the bin/ plinthctl sits
// in (found through a symbolic link), whatever the working directory;
// help names them in words, never as this machine's paths.
func TestOutDirDefaults(t *testing.T) {
	tmp, err := filepath.EvalSymlinks(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	out := filepath.Join(tmp, "out")
	bin := filepath.Join(out, "bin", "plinthctl")
	link := filepath.Join(tmp, "path", "plinthctl")
	for _, d := range []string{filepath.Dir(bin), filepath.Dir(link)} {
		os.MkdirAll(d, 0o755)
	}
	os.WriteFile(bin, nil, 0o755)
	if err := os.Symlink(bin, link); err != nil {
		t.Fatal(err)
	}
	old := executable
	t.Cleanup(func() { executable = old })
	executable = func() (string, error) { return link, nil }
	if got := outDir(); got != out {
		t.Fatalf("outDir() = %q, want %q", got, out)
	}

	for cmd, words := range map[string][]string{
		"build":        {"OUT/image/BOARD", "OUT/cache", outHelp},
		"fetch-kernel": {"OUT/cache"},
		"run":          {"OUT/image/" + board.Default, "OUT/run/" + board.Default},
		"launch":       {"OUT/image/" + board.Default, "OUT/cluster"},
	} {
		help, _ := ctl(t, cmd, "--help")
		for _, w := range words {
			if !strings.Contains(help, w) {
				t.Errorf("%s --help does not name the default %q:\n%s", cmd, w, help)
			}
		}
		if strings.Contains(help, tmp) {
			t.Errorf("%s --help names this machine's path %s:\n%s", cmd, tmp, help)
		}
	}
	// Without --image, run and launch look for the image under OUT, and
	// run makes no state directory when there is none.
	for _, cmd := range []string{"run", "launch"} {
		_, stderr, code := runCLI(cmd)
		if want := "no image in " + filepath.Join(out, "image", board.Default); code != 1 || !strings.Contains(stderr, want) {
			t.Errorf("%s without --image: exit %d, %s\nwant %q", cmd, code, stderr, want)
		}
	}
	if _, err := os.Stat(filepath.Join(out, "run")); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("run made %s: %v", filepath.Join(out, "run"), err)
	}

	// A binary of go run or go test (in the build cache), or one that
	// cannot find itself: out in the working directory.
	cached := filepath.Join(tmp, "go-build123", "b001", "exe", "plinthctl")
	os.MkdirAll(filepath.Dir(cached), 0o755)
	os.WriteFile(cached, nil, 0o755)
	for name, exe := range map[string]func() (string, error){
		"go run":  func() (string, error) { return cached, nil },
		"unknown": func() (string, error) { return "", errors.New("no executable") },
	} {
		executable = exe
		c := &runCmd{}
		c.defaults()
		if got := outDir(); got != "out" || c.state != filepath.Join("out", "run", board.Default) || c.ownerDir != filepath.Join(c.state, "owner") {
			t.Errorf("%s: outDir() = %q, run defaults %+v", name, got, c)
		}
	}
}
