package main

import (
	"context"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// TestWriteDiskChecksParameters: write-disk refuses missing flags and
// parameters that do not decode or validate before it opens the target.
func TestWriteDiskChecksParameters(t *testing.T) {
	dir := t.TempDir()
	target := filepath.Join(dir, "disk.raw")
	garbage := filepath.Join(dir, "garbage.pb")
	os.WriteFile(garbage, []byte("\xff\xff not a protobuf"), 0o644)
	for name, args := range map[string][]string{
		"no flags":       nil,
		"no parameters":  {"-image", dir, "-device", target},
		"garbage params": {"-image", dir, "-params", garbage, "-device", target},
		"missing params": {"-image", dir, "-params", filepath.Join(dir, "none.pb"), "-device", target},
	} {
		err := new(writeDiskCmd).run(context.Background(), args, io.Discard, io.Discard)
		if err == nil {
			t.Errorf("%s: no error", name)
		}
		if name == "garbage params" && !strings.Contains(err.Error(), "nothing was written") {
			t.Errorf("%s: %v", name, err)
		}
		if _, err := os.Stat(target); err == nil {
			t.Fatalf("%s: the target was created", name)
		}
	}
}
