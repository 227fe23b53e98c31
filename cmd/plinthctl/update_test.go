package main

import (
	"strings"
	"testing"
)

// TestUpdateFlags: combinations that make no sense are refused as wrong
// usage (exit 2) before any cluster is dialled, each with what to do
// instead.
func TestUpdateFlags(t *testing.T) {
	for _, c := range []struct {
		args []string
		want string
	}{
		{[]string{"node", "update", "n1"}, "nothing to install: give --image DIR"},
		{[]string{"node", "update", "--image", "dir"}, "missing arguments: want NODE"},
		{[]string{"cluster", "update", "n1", "--image", "dir"}, "unexpected arguments"},
		{[]string{"cluster", "update", "--all", "--image", "dir"}, "unknown flag: --all"},
		{[]string{"node", "update", "n1", "--activate", "--image", "dir"}, "--image installs an update, --activate and --cancel act on one already installed"},
		{[]string{"node", "update", "n1", "--activate", "--cancel"}, "give one of them"},
		{[]string{"cluster", "update", "--activate"}, "--activate and --cancel act on one node's installed update: run plinthctl node update NODE --activate"},
		{[]string{"cluster", "update", "--cancel", "--image", "dir"}, "act on one node's installed update"},
		{[]string{"node", "update", "n1", "--cancel", "--stage"}, "--activate and --cancel act on NODE's installed update"},
		{[]string{"node", "update", "n1", "--image", "dir", "--stage", "--no-reboot"}, "--stage and --no-reboot exclude each other"},
		{[]string{"cluster", "update", "--image", "dir", "--no-reboot"}, "--stage installs everywhere"},
		{[]string{"node", "update", "n1", "--activate", "--allow-downgrade"}, "--allow-downgrade goes with --image"},
		{[]string{"node", "update", "n1", "--image", "dir", "--allow-downgrade"}, "--allow-downgrade needs --sign-key"},
		{[]string{"node", "update", "n1", "--image", "dir", "--sign-key", "k"}, "--allow-downgrade needs --sign-key"},
		{[]string{"node", "update", "n1", "--image", "dir", "-o", "json"}, "prints no object"},
	} {
		// An empty configuration: dialling would fail with exit 1.
		_, stderr, code := runCLI(append(c.args, "--config", t.TempDir())...)
		if code != 2 || !strings.Contains(stderr, c.want) {
			t.Errorf("plinthctl %s: exit %d, want 2 with %q:\n%s", strings.Join(c.args, " "), code, c.want, stderr)
		}
	}
}
