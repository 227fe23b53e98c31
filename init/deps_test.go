package main

import (
	"os/exec"
	"strings"
	"testing"
)

// TestLinksNoTestCode: /init (PID 1) and plinthctl link nothing they do
// not run: no package testing, no test helper of this module, not the VM
// tests' package (plinthctl launches through package launch). go list
// reads the import graph without compiling it.
func TestLinksNoTestCode(t *testing.T) {
	for _, pkg := range []string{"plinth.dev/plinth/init", "plinth.dev/plinth/cmd/plinthctl"} {
		out, err := exec.Command("go", "list", "-deps", pkg).Output()
		if err != nil {
			t.Fatalf("go list -deps %s: %v", pkg, err)
		}
		for dep := range strings.Lines(string(out)) {
			dep = strings.TrimSpace(dep)
			if dep == "testing" || dep == "plinth.dev/plinth/vmtest" || strings.HasPrefix(dep, "plinth.dev/plinth/internal/testutil") {
				t.Errorf("%s links %s", pkg, dep)
			}
		}
	}
}
