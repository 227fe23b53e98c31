//go:build built

package vmtest

import (
	"context"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	"plinth.dev/plinth/launch"
)

// unsafeName matches what must not go into a directory name; subtest names
// contain '/' and arbitrary text.
var unsafeName = regexp.MustCompile(`[^A-Za-z0-9._-]+`)

// testDir returns a per-test directory under $PLINTH_VMTEST_DIR (default:
// <repo>/out/vmtest) named after t.Name(), emptied at start. A passing
// test's directory is removed; a failing test's is kept and its path
// logged, because the console log is usually the only clue to what the
// guest did. PLINTH_VMTEST_KEEP=1 keeps every test's directory.
func testDir(t *testing.T) string {
	t.Helper()
	base, err := launch.FromEnv("PLINTH_VMTEST_DIR", "vmtest")
	if err != nil {
		t.Fatal(err)
	}
	name := strings.Trim(unsafeName.ReplaceAllString(t.Name(), "_"), "_.")
	if name == "" {
		name = "test"
	}
	dir := filepath.Join(base, name)
	// Leftovers from an earlier failed run would be mistaken for this run's.
	if err := os.RemoveAll(dir); err != nil {
		t.Fatalf("vmtest: %v", err)
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatalf("vmtest: %v", err)
	}
	t.Cleanup(func() {
		if t.Failed() || os.Getenv("PLINTH_VMTEST_KEEP") != "" {
			t.Logf("console log kept at %s", filepath.Join(dir, "console.log"))
			return
		}
		os.RemoveAll(dir)
	})
	return dir
}

// launchT launches a node for the duration of t, failing t if it cannot.
// An empty WorkDir defaults to testDir(t) and an empty Name to t.Name().
// If t fails, the console tail is logged at cleanup so that CI output
// shows what the guest was doing without fetching artifacts.
func launchT(t *testing.T, ctx context.Context, o launch.NodeOptions) *launch.Node {
	t.Helper()
	if o.WorkDir == "" {
		o.WorkDir = testDir(t)
	}
	if o.Name == "" {
		o.Name = t.Name()
	}
	if o.Progress == nil {
		o.Progress = logWriter{t}
	}
	n, err := launch.Launch(ctx, o)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := n.Close(); err != nil {
			t.Errorf("closing node %s: %v", o.Name, err)
		}
		if t.Failed() {
			t.Logf("node %s (qemu %s), last console lines:\n%s", o.Name, n.ExitStatus(), n.Tail())
		}
	})
	return n
}

// logWriter turns a progress writer's lines into t.Log lines.
type logWriter struct{ t *testing.T }

func (w logWriter) Write(b []byte) (int, error) {
	w.t.Log(strings.TrimRight(string(b), "\n"))
	return len(b), nil
}

// step runs one step of a long scenario as a subtest, so that the
// output names it and its duration; a failed step ends the scenario,
// and so does one that -run left out (the steps after it need it).
func step(t *testing.T, name string, f func(t *testing.T)) {
	t.Helper()
	ran := false
	if !t.Run(name, func(t *testing.T) { ran = true; f(t) }) {
		t.FailNow()
	}
	if !ran {
		t.Skipf("step %s not selected by -run: the steps after it need it", name)
	}
}
