package atomicfile

import (
	"os"
	"path/filepath"
	"testing"
)

func TestWriteReplacesWholeFile(t *testing.T) {
	p := filepath.Join(t.TempDir(), "f")
	if err := Write(p, []byte("a long first version"), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := Write(p, []byte("v2"), 0o640); err != nil {
		t.Fatal(err)
	}
	b, err := os.ReadFile(p)
	if err != nil || string(b) != "v2" {
		t.Fatalf("contents %q, %v", b, err)
	}
	if st, _ := os.Stat(p); st.Mode().Perm() != 0o640 {
		t.Errorf("mode %v", st.Mode().Perm())
	}
	if _, err := os.Stat(p + ".tmp"); !os.IsNotExist(err) {
		t.Errorf("temporary file left behind: %v", err)
	}
	if err := Write(filepath.Join(p, "not-a-dir", "x"), nil, 0o600); err == nil {
		t.Error("write below a file succeeded")
	}
}
