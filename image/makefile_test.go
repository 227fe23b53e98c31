package image

import (
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

// TestMakeRebuildsOnImportedPackages: make rebuilds a binary when a file
// of any package of this module it imports changes, not only its own
// directory (scripts/godeps): a change in roleserver/kubernetes/netpol
// must reach the kube binary, not only one in cmd/kube. Each case
// asks `make -n` what it would do with fresh binaries and stamps under a
// temporary OUT and one file taken as changed (-W).
func TestMakeRebuildsOnImportedPackages(t *testing.T) {
	root, err := filepath.Abs("..")
	if err != nil {
		t.Fatal(err)
	}
	out := t.TempDir()
	for _, f := range []string{"bin/kube", "bin/kubectl", "bin/testpod", "stamp/kube", "stamp/kubectl", "stamp/testpod"} {
		p := filepath.Join(out, f)
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(p, nil, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	for _, c := range []struct {
		target, changed string
		rebuild         bool
	}{
		{"stamp/kube", "roleserver/kubernetes/netpol/controller.go", true},
		{"stamp/kube", "cmd/kube/netpol.go", true},
		{"stamp/kube", "roleserver/consensus/logging.go", false}, // not linked into kube
		{"stamp/kube", "", false},
		{"stamp/testpod", "cmd/testpod/main.go", true},
	} {
		args := []string{"-C", root, "-n", "OUT=" + out}
		if c.changed != "" {
			// godeps names files by absolute path, as go list does.
			args = append(args, "-W", filepath.Join(root, c.changed))
		}
		cmd := exec.Command("make", append(args, filepath.Join(out, c.target))...)
		cmd.Env = withoutMakeEnv(os.Environ())
		b, err := cmd.CombinedOutput()
		if err != nil {
			t.Fatalf("make %v: %v\n%s", args, err, b)
		}
		bin := filepath.Join(out, "bin", filepath.Base(c.target))
		if got := strings.Contains(string(b), "scripts/gobuild "+bin+" "); got != c.rebuild {
			t.Errorf("%s changed: make would rebuild %s: %v, want %v; make -n printed:\n%s", c.changed, c.target, got, c.rebuild, b)
		}
	}
}

// withoutMakeEnv drops what a make running the tests (make test) passes
// to its children, so that the make run here is a make of its own: no
// jobserver, flags or recursion level inherited.
func withoutMakeEnv(env []string) []string {
	var out []string
	for _, kv := range env {
		switch strings.SplitN(kv, "=", 2)[0] {
		case "MAKEFLAGS", "MFLAGS", "MAKELEVEL", "GNUMAKEFLAGS", "MAKEOVERRIDES":
			continue
		}
		out = append(out, kv)
	}
	return out
}
