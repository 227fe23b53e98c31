package main

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// TestWriteDiskChecksParameters: write-disk refuses missing flags (wrong
// usage, exit 2) and parameters that do not decode or validate (exit 1)
// before it opens the target.
func TestWriteDiskChecksParameters(t *testing.T) {
	dir := t.TempDir()
	target := filepath.Join(dir, "disk.raw")
	garbage := filepath.Join(dir, "garbage.pb")
	os.WriteFile(garbage, []byte("\xff\xff not a protobuf"), 0o644)
	for name, tc := range map[string]struct {
		args []string
		code int
		want string
	}{
		"no flags":       {nil, 2, "--image is required"},
		"no parameters":  {[]string{"--image", dir, "--device", target}, 2, "--params is required"},
		"no device":      {[]string{"--image", dir, "--params", garbage}, 2, "--device is required"},
		"stray argument": {[]string{"--image", dir, "--params", garbage, "--device", target, "stray"}, 2, "unexpected arguments"},
		"garbage params": {[]string{"--image", dir, "--params", garbage, "--device", target}, 1, "nothing was written"},
		"missing params": {[]string{"--image", dir, "--params", filepath.Join(dir, "none.pb"), "--device", target}, 1, "--params"},
	} {
		_, stderr, code := runCLI(append([]string{"write-disk"}, tc.args...)...)
		if code != tc.code || !strings.Contains(stderr, tc.want) {
			t.Errorf("%s: exit %d, %s\nwant exit %d, %q", name, code, stderr, tc.code, tc.want)
		}
		if _, err := os.Stat(target); err == nil {
			t.Fatalf("%s: the target was created", name)
		}
	}
}
