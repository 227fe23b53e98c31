package e2especs

import (
	"errors"
	"os"
	"path/filepath"
	"slices"
	"testing"
)

func TestReadNames(t *testing.T) {
	p := filepath.Join(t.TempDir(), "names")
	os.WriteFile(p, []byte("# a comment\n\n  [sig-node] Pods a [Conformance]  \n[sig-apps] Job b\n"), 0o644)
	names, err := ReadNames(p)
	if err != nil || !slices.Equal(names, []string{"[sig-node] Pods a [Conformance]", "[sig-apps] Job b"}) {
		t.Fatalf("ReadNames: %q, %v", names, err)
	}
	os.WriteFile(p, []byte("# only a comment\n"), 0o644)
	if names, err := ReadNames(p); err == nil {
		t.Fatalf("a file naming no spec read as %q", names)
	}
}

func TestReadProgress(t *testing.T) {
	p := filepath.Join(t.TempDir(), "progress.jsonl")
	os.WriteFile(p, []byte(`{"state":"passed","seconds":1.5,"name":"[sig-node] a"}
{"state":"timedout","seconds":900,"name":"[sig-node] b","failure":"timed out (x.go:1)"}
{"state":"pass`), 0o644)
	specs, err := ReadProgress(p)
	if err != nil || len(specs) != 2 || specs[0].Outcome() != "passed" || specs[1].Outcome() != "failed" || specs[1].Failure == "" {
		t.Fatalf("ReadProgress: %+v, %v (want a pass and a failure, the partial line left out)", specs, err)
	}
}

// The smoke's specs (make test) are specs of the measured quick
// selection: a name that no spec has would select nothing, and the
// smoke would report it not run only on a VM test run.
func TestSmokeNamesAreQuick(t *testing.T) {
	smoke, err := ReadNames("../../../conformance/smoke.txt")
	if err != nil {
		t.Fatal(err)
	}
	quick, err := ReadNames("../../../conformance/quick.txt")
	if err != nil {
		t.Fatal(err)
	}
	for _, n := range smoke {
		if !slices.Contains(quick, n) {
			t.Errorf("smoke.txt names %q, which quick.txt has not", n)
		}
	}
}

func TestSuiteVersion(t *testing.T) {
	p := filepath.Join(t.TempDir(), "log")
	os.WriteFile(p, []byte("Running Suite\n  I1207 12:00:01.000000 1 e2e.go:245] e2e test version: v1.37.2\nRan 1 of 2 Specs\n"), 0o644)
	if v, minor, err := SuiteVersion(p); err != nil || v != "v1.37.2" || minor != "v1.37" {
		t.Errorf("SuiteVersion = %q, %q, %v", v, minor, err)
	}
	os.WriteFile(p, []byte("Ran 1 of 2 Specs\nSUCCESS!\n"), 0o644)
	if _, _, err := SuiteVersion(p); !errors.Is(err, ErrNoSuiteVersion) {
		t.Errorf("a log without the version line: %v", err)
	}
}
