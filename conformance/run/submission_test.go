package main

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"go.yaml.in/yaml/v2"
)

// TestWriteSubmission: a qualifying run gives vX.Y/plinth/ with the
// run's log and report unedited, PRODUCT.yaml (the repository's, its
// version the image's, every required field set) and a README; a run
// that took two attempts, failed a spec, or whose log names no suite
// version gives none, saying why.
func TestWriteSubmission(t *testing.T) {
	dir := t.TempDir()
	log := filepath.Join(dir, "e2e-certification-1.log")
	logText := "Running Suite: Kubernetes e2e suite\n  I1207 12:00:01.000000 1 e2e.go:245] e2e test version: v1.37.2\nRan 462 of 7000 Specs\nSUCCESS! -- 462 Passed | 0 Failed | 0 Pending | 6538 Skipped\n"
	os.WriteFile(log, []byte(logText), 0o644)
	junit := filepath.Join(dir, "junit_01.xml")
	os.WriteFile(junit, []byte(`<testsuites tests="7000"></testsuites>`), 0o644)
	good := submissionRun{attempts: 1, planned: 462, passed: 462, log: log, junit: junit,
		product: "../PRODUCT.yaml", plinthVersion: "0.9.0-abc", nodes: 2, memoryMiB: 4096}

	out, err := writeSubmission(dir, good)
	if err != nil {
		t.Fatal(err)
	}
	if want := filepath.Join(dir, "submission", "v1.37", "plinth"); out != want {
		t.Errorf("submission in %s, want %s", out, want)
	}
	if b, _ := os.ReadFile(filepath.Join(out, "e2e.log")); string(b) != logText {
		t.Errorf("e2e.log is not the run's: %q", b)
	}
	if b, _ := os.ReadFile(filepath.Join(out, "junit_01.xml")); !strings.Contains(string(b), `tests="7000"`) {
		t.Errorf("junit_01.xml is not the run's: %q", b)
	}
	var product map[string]string
	b, _ := os.ReadFile(filepath.Join(out, "PRODUCT.yaml"))
	if err := yaml.Unmarshal(b, &product); err != nil {
		t.Fatal(err)
	}
	for _, f := range productFields {
		if product[f] == "" {
			t.Errorf("PRODUCT.yaml has no %s:\n%s", f, b)
		}
	}
	if product["version"] != "0.9.0-abc" || product["name"] != "Plinth" || product["type"] != "distribution" {
		t.Errorf("PRODUCT.yaml:\n%s", b)
	}
	if b, _ := os.ReadFile(filepath.Join(out, "README.md")); !strings.Contains(string(b), "make conformance CONFORMANCE=certify") || !strings.Contains(string(b), "v1.37.2") {
		t.Errorf("README.md says not how to reproduce the run:\n%s", b)
	}

	noVersion := filepath.Join(dir, "other.log")
	os.WriteFile(noVersion, []byte("Ran 462 of 7000 Specs\n"), 0o644)
	emptyProduct := filepath.Join(dir, "PRODUCT.yaml")
	os.WriteFile(emptyProduct, []byte("vendor: x\nname: Plinth\ntype: distribution\ndescription: d\nrepo_url: r\ndocumentation_url: u\n"), 0o644)
	for name, change := range map[string]func(*submissionRun){
		"two attempts":     func(r *submissionRun) { r.attempts = 2 },
		"a failure":        func(r *submissionRun) { r.passed = 461 },
		"no version line":  func(r *submissionRun) { r.log = noVersion },
		"no JUnit report":  func(r *submissionRun) { r.junit = filepath.Join(dir, "none.xml") },
		"no image version": func(r *submissionRun) { r.plinthVersion = "" },
	} {
		r := good
		change(&r)
		if _, err := writeSubmission(t.TempDir(), r); !errors.Is(err, errNotSubmittable) {
			t.Errorf("%s: %v, want errNotSubmittable", name, err)
		}
	}
	r := good
	r.product = emptyProduct
	if _, err := writeSubmission(t.TempDir(), r); err == nil || !strings.Contains(err.Error(), "website_url") {
		t.Errorf("a PRODUCT.yaml without website_url: %v", err)
	}
}
