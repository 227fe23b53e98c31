package main

import (
	"os"
	"strings"
	"testing"
)

// The package comment lists every verb, and nothing that is not one.
func TestPackageCommentListsEveryVerb(t *testing.T) {
	src, err := os.ReadFile("main.go")
	if err != nil {
		t.Fatal(err)
	}
	doc, _, ok := strings.Cut(string(src), "\npackage main")
	if !ok {
		t.Fatal("main.go: no package clause")
	}
	listed := map[string]bool{}
	for _, line := range strings.Split(doc, "\n") {
		if f := strings.Fields(strings.TrimPrefix(line, "//")); len(f) > 1 && f[0] == "plinthctl" {
			listed[f[1]] = true
		}
	}
	for name := range commands {
		if !listed[name] {
			t.Errorf("the package comment does not list plinthctl %s", name)
		}
	}
	for name := range listed {
		if _, ok := commands[name]; !ok {
			t.Errorf("the package comment lists plinthctl %s, which is no verb", name)
		}
	}
}
