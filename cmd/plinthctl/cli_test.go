package main

import (
	"bytes"
	"encoding/json"
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/spf13/cobra"
)

var update = flag.Bool("update", false, "rewrite docs/reference/cli.md from the command tree")

// cliReferencePath is the generated CLI reference, relative to this
// package.
const cliReferencePath = "../../docs/reference/cli.md"

// The CLI reference is generated from the tree and current: a command or
// flag changed without `make cli-docs` fails here.
func TestCLIReference(t *testing.T) {
	t.Setenv("PLINTH_CONFIG", "")
	root, _ := newRoot(new(bytes.Buffer), new(bytes.Buffer))
	got := cliReference(root)
	if *update {
		if err := os.WriteFile(cliReferencePath, got, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	want, err := os.ReadFile(cliReferencePath)
	if err != nil {
		t.Fatalf("%v (make cli-docs writes it)", err)
	}
	if !bytes.Equal(got, want) {
		t.Errorf("%s is not current: run make cli-docs", filepath.Clean(cliReferencePath))
	}
}

// cliReference is the reference page: the global flags, then every
// visible command in the tree's order with its usage and flags.
func cliReference(root *cobra.Command) []byte {
	root.InitDefaultHelpCmd()
	root.InitDefaultCompletionCmd()
	var b bytes.Buffer
	b.WriteString("# plinthctl command reference\n\n")
	b.WriteString("Generated from plinthctl's command tree by `make cli-docs`; `make test`\nchecks that it is current. `plinthctl COMMAND --help` prints the same.\n\n")
	b.WriteString("## Global flags\n\nEvery command takes these:\n\n```\n")
	b.WriteString(root.PersistentFlags().FlagUsages())
	b.WriteString("```\n\n## Commands\n\n")
	var walk func(c *cobra.Command)
	var sections bytes.Buffer
	walk = func(c *cobra.Command) {
		for _, sub := range c.Commands() {
			if !sub.IsAvailableCommand() || sub.Name() == "help" {
				continue
			}
			fmt.Fprintf(&b, "%s- [%s](#%s): %s\n", strings.Repeat("  ", depth(sub)-1), sub.CommandPath(), anchor(sub.CommandPath()), sub.Short)
			fmt.Fprintf(&sections, "## %s\n\n%s.\n\n", sub.CommandPath(), strings.TrimSuffix(sub.Short, "."))
			if sub.Long != "" {
				fmt.Fprintf(&sections, "%s\n\n", sub.Long)
			}
			fmt.Fprintf(&sections, "```\n%s\n```\n\n", sub.UseLine())
			if fl := sub.LocalNonPersistentFlags().FlagUsages(); fl != "" {
				fmt.Fprintf(&sections, "Flags:\n\n```\n%s```\n\n", fl)
			}
			walk(sub)
		}
	}
	walk(root)
	b.WriteString("\n")
	b.Write(bytes.TrimRight(sections.Bytes(), "\n"))
	b.WriteString("\n")
	return b.Bytes()
}

func depth(c *cobra.Command) int {
	n := 0
	for p := c.Parent(); p != nil; p = p.Parent() {
		n++
	}
	return n
}

// anchor is the heading ID a Markdown renderer (and docs_test) gives a
// heading.
func anchor(heading string) string {
	return strings.ReplaceAll(strings.ToLower(heading), " ", "-")
}

// plinthctl --help shows the commands in their groups.
func TestHelpShowsGroups(t *testing.T) {
	out, _ := ctl(t, "--help")
	for _, want := range []string{"Cluster commands", "Images and machines", "node ", "cluster ", "build ", "version "} {
		if !strings.Contains(out, want) {
			t.Errorf("plinthctl --help does not show %q:\n%s", want, out)
		}
	}
	if strings.Contains(out, "kubernetes-credential") {
		t.Errorf("plinthctl --help shows the hidden kubernetes-credential:\n%s", out)
	}
}

func TestCompletion(t *testing.T) {
	for _, sh := range []string{"bash", "zsh", "fish"} {
		out, _ := ctl(t, "completion", sh)
		if !strings.Contains(out, "plinthctl") || len(out) < 1000 {
			t.Errorf("plinthctl completion %s: %d bytes, not a completion script", sh, len(out))
		}
	}
	// What the bash script asks for when the user presses tab.
	out, _ := ctl(t, "__complete", "node", "")
	for _, want := range []string{"approve", "list", "reboot", "poweroff"} {
		if !strings.Contains(out, want) {
			t.Errorf("completing plinthctl node: no %s in\n%s", want, out)
		}
	}
}

// Old verbs and one-dash long flags are refused, naming the new spelling.
func TestLegacySpellings(t *testing.T) {
	for _, c := range []struct {
		args []string
		want string
	}{
		{[]string{"nodes", "list"}, "plinthctl node list"},
		{[]string{"approve"}, "plinthctl node approve"},
		{[]string{"takeownership", "-endpoint", "x:1"}, "plinthctl cluster takeownership"},
		{[]string{"release-key", "-o", "k"}, "plinthctl release key"},
		{[]string{"update", "-all"}, "cluster update"},
		{[]string{"node", "list", "-config", "/nonexistent"}, "--config, not -config"},
		{[]string{"node", "status", "-all", "n"}, "--all, not -all"},
	} {
		_, stderr, code := runCLI(c.args...)
		if code != 2 || !strings.Contains(stderr, c.want) {
			t.Errorf("plinthctl %s: exit %d, want 2 and %q in:\n%s", strings.Join(c.args, " "), code, c.want, stderr)
		}
	}
}

// Wrong usage prints the reason and the command's usage, and exits 2;
// a failure exits 1.
func TestUsageErrors(t *testing.T) {
	for _, c := range []struct {
		args []string
		want string
	}{
		{nil, "missing command"},
		{[]string{"nod"}, `unknown command "nod"`},
		{[]string{"node"}, "missing subcommand"},
		{[]string{"node", "frobnicate"}, `unknown command "frobnicate"`},
		{[]string{"node", "reboot"}, "missing arguments: want NODE"},
		{[]string{"node", "reboot", "a", "b"}, `unexpected arguments ["b"]`},
		{[]string{"node", "list", "--frob"}, "unknown flag: --frob"},
		{[]string{"node", "list", "-o", "xml"}, "-o xml: unknown format"},
		{[]string{"node", "reboot", "-o", "json", "n"}, "prints no object"},
	} {
		_, stderr, code := runCLI(c.args...)
		if code != 2 || !strings.Contains(stderr, c.want) || !strings.Contains(stderr, "Usage:") {
			t.Errorf("plinthctl %s: exit %d, want 2, %q and the usage in:\n%s", strings.Join(c.args, " "), code, c.want, stderr)
		}
	}
	_, stderr, code := runCLI("node", "list", "--config", t.TempDir())
	if code != 1 || !strings.Contains(stderr, "plinthctl cluster takeownership") || strings.Contains(stderr, "Usage:") {
		t.Errorf("node list without an owner configuration: exit %d, want 1 and what to do next:\n%s", code, stderr)
	}
}

// version prints the client's version and, with an owned cluster, every
// node's, in each format.
func TestVersion(t *testing.T) {
	out, _ := ctl(t, "version", "--config", t.TempDir())
	if out != "Client: dev\n" {
		t.Errorf("version without a cluster: %q", out)
	}
	f := newFakeCluster(t)
	cfg := f.owned(t)
	out, _ = ctl(t, "version", "--config", cfg, "-o", "json")
	var v versions
	if err := json.Unmarshal([]byte(out), &v); err != nil {
		t.Fatalf("version -o json: %v\n%s", err, out)
	}
	if v.Client != "dev" || len(v.Nodes) == 0 || v.Nodes[0].ID == "" {
		t.Errorf("version -o json: %+v", v)
	}
	out, _ = ctl(t, "version", "--config", cfg, "-o", "yaml")
	if !strings.Contains(out, "client: dev") || !strings.Contains(out, "nodes:") {
		t.Errorf("version -o yaml:\n%s", out)
	}
}

// Every read command prints JSON that parses.
func TestNodeReadsAsJSON(t *testing.T) {
	f := newFakeCluster(t)
	cfg := f.owned(t)
	out, _ := ctl(t, "node", "list", "--config", cfg, "-o", "json")
	var nodes []map[string]any
	if err := json.Unmarshal([]byte(out), &nodes); err != nil || len(nodes) == 0 {
		t.Fatalf("node list -o json: %v\n%s", err, out)
	}
	id, _ := nodes[0]["id"].(string)
	out, _ = ctl(t, "node", "describe", id, "--config", cfg, "-o", "json")
	var node map[string]any
	if err := json.Unmarshal([]byte(out), &node); err != nil || node["id"] != id {
		t.Errorf("node describe -o json: %v\n%s", err, out)
	}
	out, _ = ctl(t, "node", "list", "--config", cfg, "-o", "yaml")
	if !strings.Contains(out, "- ") || !strings.Contains(out, id) {
		t.Errorf("node list -o yaml:\n%s", out)
	}
}
