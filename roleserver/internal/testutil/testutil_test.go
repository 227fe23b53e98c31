package testutil

import (
	"os/exec"
	"strings"
	"testing"
)

// TestNotImportedByProduction: no non-test package of the module imports
// this one, so none of it reaches /init or plinthctl.
func TestNotImportedByProduction(t *testing.T) {
	const self = "plinth.dev/plinth/roleserver/internal/testutil"
	cmd := exec.Command("go", "list", "-f", `{{.ImportPath}}{{range .Imports}} {{.}}{{end}}`, "plinth.dev/plinth/...")
	var stderr strings.Builder
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("go list: %v\n%s", err, stderr.String())
	}
	for line := range strings.SplitSeq(strings.TrimSpace(string(out)), "\n") {
		f := strings.Fields(line)
		for _, imp := range f[1:] {
			if imp == self {
				t.Errorf("%s imports %s outside its tests", f[0], self)
			}
		}
	}
	if !strings.Contains(string(out), "plinth.dev/plinth/init ") {
		t.Errorf("go list did not list /init:\n%s", out)
	}
}
