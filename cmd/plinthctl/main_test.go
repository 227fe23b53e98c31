package main

import (
	"bytes"
	"os"
	"strings"
	"testing"
)

// The package comment names every visible command of the tree, and the
// tree has every command the comment names.
func TestPackageCommentListsEveryCommand(t *testing.T) {
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
		f := strings.Fields(strings.TrimPrefix(line, "//"))
		if len(f) < 2 || f[0] != "plinthctl" {
			continue
		}
		if len(f) == 2 { // plinthctl a|b|c
			for _, w := range strings.Split(f[1], "|") {
				listed[w] = true
			}
			continue
		}
		for _, w := range strings.Split(f[2], "|") { // plinthctl noun a|b
			listed[f[1]+" "+w] = true
		}
	}
	root, _ := newRoot(new(bytes.Buffer), new(bytes.Buffer))
	root.InitDefaultCompletionCmd()
	tree := map[string]bool{}
	for _, c := range root.Commands() {
		if c.Hidden || c.Name() == "help" {
			continue
		}
		if !c.HasSubCommands() || c.Name() == "completion" {
			tree[c.Name()] = true
		}
		for _, sub := range c.Commands() {
			if c.Name() != "completion" {
				tree[c.Name()+" "+sub.Name()] = true
			}
		}
	}
	for name := range tree {
		if !listed[name] {
			t.Errorf("the package comment does not list plinthctl %s", name)
		}
	}
	for name := range listed {
		if !tree[name] {
			t.Errorf("the package comment lists plinthctl %s, which is no command", name)
		}
	}
}
