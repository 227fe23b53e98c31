package fakecluster

import (
	"os/exec"
	"slices"
	"strings"
	"testing"
)

// TestNotImportedByProduction: only tests import the fake, so none of it
// reaches /init or plinthctl. (.Imports are a package's non-test imports.)
func TestNotImportedByProduction(t *testing.T) {
	const self = "plinth.dev/plinth/internal/testutil/fakecluster"
	out, err := exec.Command("go", "list", "-f", `{{.ImportPath}}: {{join .Imports " "}}`, "plinth.dev/plinth/...").CombinedOutput()
	if err != nil {
		t.Fatalf("go list: %v\n%s", err, out)
	}
	listed := 0
	for line := range strings.Lines(string(out)) {
		pkg, imports, _ := strings.Cut(strings.TrimSpace(line), ": ")
		listed++
		if slices.Contains(strings.Fields(imports), self) {
			t.Errorf("%s imports %s outside its tests", pkg, self)
		}
	}
	if listed < 10 {
		t.Errorf("go list listed %d packages:\n%s", listed, out)
	}
}
