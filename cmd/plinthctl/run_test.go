package main

import (
	"bytes"
	"crypto/ed25519"
	"io"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"plinth.dev/plinth/api/nodepb"
	"plinth.dev/plinth/roleserver/identity"
	"plinth.dev/plinth/roleserver/owner"
	"plinth.dev/plinth/roleserver/parameters"
)

// TestRunFirstRunParameters: the first run writes a node's real
// defaults (consensus member, Kubernetes controller and worker), plus
// only the unmeasured-boot exception QEMU's -kernel needs, and the owner
// key that matches them.
func TestRunFirstRunParameters(t *testing.T) {
	state := t.TempDir()
	c := &runCmd{state: state, ownerDir: filepath.Join(state, "owner")}
	var stderr bytes.Buffer
	p, err := c.nodeParameters(&stderr)
	if err != nil {
		t.Fatal(err)
	}
	raw, err := os.ReadFile(filepath.Join(state, "parameters.pb"))
	if err != nil {
		t.Fatal(err)
	}
	decoded, err := parameters.Decode(raw)
	if err != nil {
		t.Fatal(err)
	}
	for name, p := range map[string]*nodepb.Parameters{"returned": p, "decoded from the file": decoded} {
		controller, worker := parameters.RunsKubernetes(p)
		if p.GetBootstrap() == nil || !controller || !worker {
			t.Errorf("%s: not a bootstrap node with both Kubernetes roles: %v", name, p)
		}
		if !p.GetTpm().GetAllowUnmeasuredBoot() || p.GetTpm().GetPolicy() != nodepb.NodeTPM_TPM_POLICY_REQUIRED {
			t.Errorf("%s: TPM %v, want required with the unmeasured-boot exception of a -kernel boot", name, p.GetTpm())
		}
	}
	// Apart from that exception, the production default.
	want := parameters.NewBootstrap(decoded.GetBootstrap().GetOwnerPublicKey())
	want.Tpm.AllowUnmeasuredBoot = true
	if wantRaw, _ := parameters.Encode(want); !bytes.Equal(raw, wantRaw) {
		t.Errorf("first-run parameters differ from parameters.NewBootstrap:\n got %v\nwant %v", decoded, want)
	}
	cfg, err := owner.LoadConfig(c.ownerDir)
	if err != nil || cfg.Key == nil || !cfg.Key.Public().(ed25519.PublicKey).Equal(ed25519.PublicKey(decoded.GetBootstrap().GetOwnerPublicKey())) {
		t.Fatalf("the saved owner key does not match the parameters: %v", err)
	}

	// The second run reads them again, unchanged, and makes no new key.
	c2 := &runCmd{state: state, ownerDir: c.ownerDir}
	if _, err := c2.nodeParameters(&stderr); err != nil {
		t.Fatal(err)
	}
	if again, _ := os.ReadFile(filepath.Join(state, "parameters.pb")); !bytes.Equal(again, raw) {
		t.Error("the second run rewrote the parameters")
	}
	if cfg2, _ := owner.LoadConfig(c.ownerDir); !cfg2.Key.Equal(cfg.Key) {
		t.Error("the second run replaced the owner key")
	}
}

// TestRunGuide: what run prints is right for what it boots, and every
// command it prints parses as plinthctl would parse it.
func TestRunGuide(t *testing.T) {
	pub, key, _ := ed25519.GenerateKey(nil)
	g := runGuide{self: "out/bin/plinthctl", kubectl: "out/bin/kubectl", state: "out/run/q", ownerDir: "out/run/q/owner",
		owner: &owner.Config{Key: key}, params: runParameters(pub), paramsFile: "out/run/q/parameters.pb",
		curatorPort: 17835, mgmtPort: 17836, apiPort: 16443}
	out := guideText(t, g)
	for _, want := range []string{
		"  out/bin/plinthctl cluster takeownership --config out/run/q/owner --endpoint 127.0.0.1:17835 --mgmt-endpoint 127.0.0.1:17836\n",
		"  out/bin/plinthctl node list --config out/run/q/owner\n",
		"  out/bin/plinthctl node logs --config out/run/q/owner NODE\n",
		"  out/bin/plinthctl cluster kubeconfig --config out/run/q/owner --server https://127.0.0.1:16443 --wait 10m --file out/run/q/kubeconfig && out/bin/kubectl --kubeconfig out/run/q/kubeconfig get nodes\n",
		"under TCG its API server serves about 1-2 minutes after power-on",
		"NODE is the node's ID, as plinthctl node list shows it",
	} {
		if !strings.Contains(out, want) {
			t.Errorf("run's guide lacks %q:\n%s", want, out)
		}
	}
	if strings.Contains(out, "role add") {
		t.Errorf("a node with both roles is told to add roles:\n%s", out)
	}

	// Owned already: no takeownership.
	g.owner = &owner.Config{Key: key, Credentials: &identity.Credentials{}}
	if out = guideText(t, g); strings.Contains(out, "takeownership") || !strings.Contains(out, "you own this node") {
		t.Errorf("guide for an owned node:\n%s", out)
	}
	g.owner = &owner.Config{Key: key}

	// Parameters without Kubernetes: no kubeconfig command, but how to
	// give the node its roles.
	noKube := runParameters(pub)
	noKube.GetBootstrap().NoKubernetesController, noKube.GetBootstrap().NoKubernetesWorker = true, true
	g.params = noKube
	out = guideText(t, g)
	if strings.Contains(out, "kubeconfig") || !strings.Contains(out, "  out/bin/plinthctl role add --config out/run/q/owner NODE kubernetes-controller kubernetes-worker\n") {
		t.Errorf("guide for a node without Kubernetes:\n%s", out)
	}
	// No forwarded API port: no kubeconfig command either.
	g.params, g.apiPort = runParameters(pub), 0
	if out = guideText(t, g); strings.Contains(out, "kubeconfig") {
		t.Errorf("guide without an API port:\n%s", out)
	}
	// No owner key: how to take ownership with another one.
	g.owner = &owner.Config{}
	if out = guideText(t, g); !strings.Contains(out, "(out/bin/plinthctl cluster takeownership --owner-key FILE)") || !strings.Contains(out, "empty --state") {
		t.Errorf("guide without an owner key:\n%s", out)
	}
}

// TestRunUsage: wrong usage of run and launch exits 2; a missing image
// exits 1 before anything is made.
func TestRunUsage(t *testing.T) {
	dir := t.TempDir()
	checkExits(t, []exitCase{
		{[]string{"run", "stray"}, 2, "unexpected arguments"},
		{[]string{"run", "-image", dir}, 2, "--image, not -image"},
		{[]string{"run", "--disk-size", "big"}, 2, "invalid argument"},
		{[]string{"run", "--image", dir, "-o", "json"}, 2, "prints no object"},
		{[]string{"run", "--image", filepath.Join(dir, "none"), "--state", filepath.Join(dir, "state")}, 1, "no image in"},
		{[]string{"launch", "stray"}, 2, "unexpected arguments"},
		{[]string{"launch", "--nodes", "0"}, 2, "want at least 1"},
		{[]string{"launch", "--image", filepath.Join(dir, "none"), "--dir", filepath.Join(dir, "cluster")}, 1, "no image in"},
	})
	if got := files(t, dir); got != "" {
		t.Errorf("refused runs left %s", got)
	}
}

// TestRunKeepsOldParameters: a state directory from an older version,
// whose parameters have Kubernetes off, keeps them as they are.
func TestRunKeepsOldParameters(t *testing.T) {
	state := t.TempDir()
	pub, _, _ := ed25519.GenerateKey(nil)
	old := runParameters(pub)
	old.GetBootstrap().NoKubernetesController, old.GetBootstrap().NoKubernetesWorker = true, true
	raw, err := parameters.Encode(old)
	if err != nil {
		t.Fatal(err)
	}
	file := filepath.Join(state, "parameters.pb")
	if err := os.WriteFile(file, raw, 0o644); err != nil {
		t.Fatal(err)
	}
	c := &runCmd{state: state, ownerDir: filepath.Join(state, "owner")}
	p, err := c.nodeParameters(new(bytes.Buffer))
	if err != nil {
		t.Fatal(err)
	}
	if controller, worker := parameters.RunsKubernetes(p); controller || worker {
		t.Errorf("an old node's parameters changed roles: %v", p)
	}
	if again, _ := os.ReadFile(file); !bytes.Equal(again, raw) {
		t.Error("run rewrote an existing node's parameters")
	}
	// A malformed document is refused before anything starts, and left.
	os.WriteFile(file, []byte("not a document"), 0o644)
	if _, err := (&runCmd{state: state, ownerDir: c.ownerDir}).nodeParameters(new(bytes.Buffer)); err == nil || !strings.Contains(err.Error(), "nothing was started") {
		t.Errorf("malformed parameters: %v", err)
	}
	if again, _ := os.ReadFile(file); string(again) != "not a document" {
		t.Error("run rewrote a malformed parameters file")
	}
}

// guideText is what g prints, after checking that every plinthctl
// command in it is one plinthctl parses (checkPrinted).
func guideText(t *testing.T, g runGuide) string {
	t.Helper()
	var b bytes.Buffer
	g.write(&b)
	for line := range strings.Lines(b.String()) {
		if cmd, ok := strings.CutPrefix(strings.TrimSpace(line), g.self+" "); ok {
			cmd, _, _ = strings.Cut(cmd, " && ")
			checkPrinted(t, strings.Fields(cmd))
		}
	}
	if strings.Contains(b.String(), "("+g.self+" ") {
		cmd := strings.SplitN(b.String(), "("+g.self+" ", 2)[1]
		cmd, _, _ = strings.Cut(cmd, ")")
		checkPrinted(t, strings.Fields(cmd))
	}
	return b.String()
}

// checkPrinted parses a printed command (the words after plinthctl) as
// plinthctl would: a command of the tree, with flags it has, spelled
// with two dashes, and as many arguments as it takes.
func checkPrinted(t *testing.T, words []string) {
	t.Helper()
	root, _ := newRoot(io.Discard, io.Discard)
	cmd, rest, err := root.Find(words)
	if err != nil {
		t.Errorf("printed %q: %v", words, err)
		return
	}
	path := strings.TrimPrefix(cmd.CommandPath(), "plinthctl ")
	if !slices.ContainsFunc(specs, func(s spec) bool { return s.path == path && !s.hidden }) {
		t.Errorf("printed %q: %q is no command", words, path)
		return
	}
	if msg := singleDashFlag(cmd, rest); msg != "" {
		t.Errorf("printed %q: %s", words, msg)
	}
	if err := cmd.ParseFlags(rest); err != nil {
		t.Errorf("printed %q: %v", words, err)
		return
	}
	if err := cmd.ValidateArgs(cmd.Flags().Args()); err != nil {
		t.Errorf("printed %q: %v", words, err)
	}
}
