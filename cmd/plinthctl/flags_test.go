package main

import (
	"flag"
	"slices"
	"testing"
)

func TestParseArgsInterspersed(t *testing.T) {
	fs := flag.NewFlagSet("x", flag.ContinueOnError)
	o := fs.String("o", "", "")
	f := fs.Bool("f", false, "")
	pos, err := parseArgs(fs, []string{"describe", "-o", "json", "node-a", "-f", "--", "-literal"})
	if err != nil || *o != "json" || !*f || !slices.Equal(pos, []string{"describe", "node-a", "-literal"}) {
		t.Errorf("pos %q, -o %q, -f %v, err %v", pos, *o, *f, err)
	}
}

func TestListFlag(t *testing.T) {
	var l listFlag
	for _, v := range []string{"a:1", " b:2 , c:3,", ""} {
		if err := l.Set(v); err != nil {
			t.Fatal(err)
		}
	}
	if !slices.Equal(l, listFlag{"a:1", "b:2", "c:3"}) || l.String() != "a:1,b:2,c:3" {
		t.Errorf("listFlag %q", l)
	}
}

// Every verb is registered with a summary and a constructor.
func TestVerbsRegistered(t *testing.T) {
	for _, name := range []string{"build", "fetch-kernel", "run", "params", "launch", "takeownership", "nodes", "approve", "roles", "ticket", "logs", "reboot", "decommission", "kubeconfig", "kubernetes-credential", "status", "write-disk", "update", "release-key", "policy", "secrets-key", "owner-key"} {
		c, ok := commands[name]
		if !ok || c.summary == "" || c.new == nil || c.new() == nil {
			t.Errorf("%s is not registered", name)
		}
	}
	if len(commands) != 22 {
		t.Errorf("%d commands registered, want 22", len(commands))
	}
}
