package main

import (
	"context"
	"io"
	"strings"
	"testing"
)

// TestUpdateFlags: combinations that make no sense are refused before
// any cluster is dialled, each with what to do instead.
func TestUpdateFlags(t *testing.T) {
	for _, c := range []struct {
		args []string
		want string
	}{
		{[]string{"node"}, "usage: plinthctl update"},
		{[]string{"-image", "dir"}, "usage: plinthctl update"},
		{[]string{"node", "-all", "-image", "dir"}, "usage: plinthctl update"},
		{[]string{"node", "-activate", "-image", "dir"}, "usage: plinthctl update"},
		{[]string{"node", "-activate", "-cancel"}, "usage: plinthctl update"},
		{[]string{"-all", "-activate"}, "-activate and -cancel act on one NODE"},
		{[]string{"node", "-cancel", "-stage"}, "-activate and -cancel act on one NODE's installed update"},
		{[]string{"node", "-image", "dir", "-stage", "-no-reboot"}, "-stage and -no-reboot exclude each other"},
		{[]string{"-all", "-image", "dir", "-no-reboot"}, "-stage installs everywhere"},
		{[]string{"node", "-activate", "-allow-downgrade"}, "-allow-downgrade goes with -image"},
		{[]string{"node", "-image", "dir", "-allow-downgrade"}, "-allow-downgrade needs -sign-key"},
		{[]string{"node", "-image", "dir", "-sign-key", "k"}, "-allow-downgrade needs -sign-key"},
	} {
		err := new(updateCmd).run(context.Background(), append([]string{"-config", t.TempDir()}, c.args...), io.Discard, io.Discard)
		if err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("update %s: %v, want an error saying %q", strings.Join(c.args, " "), err, c.want)
		}
	}
}
