package mount

import (
	"os"
	"path/filepath"
	"testing"
)

// TestMakeDevLinks: the compulsory links are made, resolve through
// /proc as the kernel's list says, a second run changes nothing, and an
// entry that exists is not replaced.
func TestMakeDevLinks(t *testing.T) {
	dev := t.TempDir()
	if err := os.WriteFile(filepath.Join(dev, "stderr"), []byte("not a link"), 0o644); err != nil {
		t.Fatal(err)
	}
	for range 2 {
		if err := MakeDevLinks(dev); err != nil {
			t.Fatal(err)
		}
	}
	for name, want := range map[string]string{"fd": "/proc/self/fd", "stdin": "fd/0", "stdout": "fd/1"} {
		if got, err := os.Readlink(filepath.Join(dev, name)); err != nil || got != want {
			t.Errorf("%s -> %q, %v; want -> %q", name, got, err, want)
		}
	}
	if b, err := os.ReadFile(filepath.Join(dev, "stderr")); err != nil || string(b) != "not a link" {
		t.Errorf("an existing stderr was replaced: %q, %v", b, err)
	}
	// Through the links as a program opens them: this process's fd 0.
	want, err := os.Readlink("/proc/self/fd/0")
	if err != nil {
		t.Fatal(err)
	}
	if got, err := os.Readlink(filepath.Join(dev, "fd", "0")); err != nil || got != want {
		t.Errorf("%s/fd/0 -> %q, %v; want this process's fd 0, %q", dev, got, err, want)
	}
}
