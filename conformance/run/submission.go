package main

import (
	"bytes"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"text/template"

	"go.yaml.in/yaml/v2"

	"plinth.dev/plinth/internal/testutil/e2especs"
	"plinth.dev/plinth/launch"
)

// A certification submission is what the CNCF's conformance repository
// asks of a product for one Kubernetes minor version, in
// vX.Y/<product>/: the e2e log and the JUnit report of one run of every
// [Conformance] spec, nothing skipped; PRODUCT.yaml; and a README saying
// how to reproduce the run.
//
//	make conformance CONFORMANCE=certify
//	  one round: focus [Conformance], no skip, ginkgo -v (serial specs
//	  last, one at a time: ginkgo keeps them apart)
//	  ──► qualifies? one attempt, every planned spec passed
//	  ──► OUT/submission/vX.Y/plinth/{e2e.log, junit_01.xml,
//	      PRODUCT.yaml (conformance/PRODUCT.yaml, version set), README.md}
//
// A run that needed a second attempt (a spec interrupted, a node lost)
// or that failed anything writes no submission: the files must be one
// run's, unedited. Nothing is submitted.

// certifyFocus is the certification's selection: every [Conformance]
// spec, the serial ones included, and no skip.
const certifyFocus = `\[Conformance\]`

// productName is the submission directory's product part.
const productName = "plinth"

// productFields are PRODUCT.yaml's required fields (the conformance
// repository's checks); product_logo_url is optional.
var productFields = []string{"vendor", "name", "version", "type", "description", "website_url", "repo_url", "documentation_url"}

// errNotSubmittable: the run does not qualify for a submission.
var errNotSubmittable = errors.New("no certification submission")

// submissionRun is what a submission is made from.
type submissionRun struct {
	attempts      int    // the certification round's attempts
	planned       int    // specs the dry run listed
	passed        int    // specs that passed
	log, junit    string // the attempt's e2e log, the suite's JUnit report
	product       string // PRODUCT.yaml template (conformance/PRODUCT.yaml)
	plinthVersion string // the image's version
	nodes         int    // the cluster's nodes
	memoryMiB     int    // each node's memory
}

// writeSubmission writes the submission under out/submission and
// returns its directory, or errNotSubmittable (wrapped, with why).
func writeSubmission(out string, r submissionRun) (string, error) {
	switch {
	case r.attempts != 1:
		return "", fmt.Errorf("%w: the run took %d attempts (a submission is one run's log and report)", errNotSubmittable, r.attempts)
	case r.planned == 0 || r.passed != r.planned:
		return "", fmt.Errorf("%w: %d of %d specs passed", errNotSubmittable, r.passed, r.planned)
	case r.plinthVersion == "":
		return "", fmt.Errorf("%w: the image's version is unknown", errNotSubmittable)
	}
	kube, minor, err := e2especs.SuiteVersion(r.log)
	if err != nil {
		return "", fmt.Errorf("%w: %v", errNotSubmittable, err)
	}
	junit, err := os.ReadFile(r.junit)
	if err != nil {
		return "", fmt.Errorf("%w: the JUnit report: %v", errNotSubmittable, err)
	}
	product, err := productYAML(r.product, r.plinthVersion)
	if err != nil {
		return "", err
	}
	dir := filepath.Join(out, "submission", minor, productName)
	if err := os.RemoveAll(dir); err != nil {
		return "", err
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return "", err
	}
	log, err := os.ReadFile(r.log)
	if err != nil {
		return "", err
	}
	readme, err := submissionReadme(r, kube)
	if err != nil {
		return "", err
	}
	for name, data := range map[string][]byte{"e2e.log": log, "junit_01.xml": junit, "PRODUCT.yaml": product, "README.md": readme} {
		if err := os.WriteFile(filepath.Join(dir, name), data, 0o644); err != nil {
			return "", err
		}
	}
	return dir, nil
}

// productYAML is the template at path with version set, every required
// field checked present and non-empty.
func productYAML(path, version string) ([]byte, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	var fields yaml.MapSlice
	if err := yaml.Unmarshal(b, &fields); err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	set := false
	for i := range fields {
		if fields[i].Key == "version" {
			fields[i].Value, set = version, true
		}
	}
	if !set {
		fields = append(fields, yaml.MapItem{Key: "version", Value: version})
	}
	out, err := yaml.Marshal(fields)
	if err != nil {
		return nil, err
	}
	var check map[string]any
	if err := yaml.Unmarshal(out, &check); err != nil {
		return nil, err
	}
	for _, f := range productFields {
		if s, ok := check[f].(string); !ok || strings.TrimSpace(s) == "" {
			return nil, fmt.Errorf("%s: required field %s is missing or empty", path, f)
		}
	}
	return out, nil
}

var readmeTemplate = template.Must(template.New("README.md").Parse(`# Plinth {{.Version}} on Kubernetes {{.Kube}}

Plinth is an immutable operating system for Kubernetes nodes. These
results come from one run of every ` + "`[Conformance]`" + ` spec of the
upstream end-to-end suite ({{.Kube}}, nothing skipped) against a cluster
of {{.Nodes}} Plinth nodes ({{.MemoryMiB}} MiB each) in QEMU: the first
node a controller and worker, the others workers, every component of
Plinth's own image.

## How to reproduce

On a Linux machine with QEMU (the Makefile installs what it needs on
Debian), from a checkout of Plinth {{.Version}}:

    make conformance CONFORMANCE=certify

It builds the node image with the conformance test images, the suite
(e2e.test) and ginkgo, boots the cluster, runs the suite once
(ginkgo, the serial specs last and one at a time), and writes this
directory from that run: out/conformance/submission/.
`))

func submissionReadme(r submissionRun, kube string) ([]byte, error) {
	var b bytes.Buffer
	err := readmeTemplate.Execute(&b, struct {
		Version, Kube    string
		Nodes, MemoryMiB int
	}{r.plinthVersion, kube, r.nodes, r.memoryMiB})
	return b.Bytes(), err
}

// submit writes the submission of the certification round, or says why
// there is none.
func (c *runCmd) submit(r round, res *results) {
	passed := 0
	for _, s := range res.specs {
		if s.Outcome() == "passed" && slices.Contains(r.planned, s.Name) {
			passed++
		}
	}
	version := ""
	if img, err := launch.LoadImage(c.image); err == nil {
		version = img.Manifest.Version
	}
	dir, err := writeSubmission(c.out, submissionRun{
		attempts: r.attempts, planned: len(r.planned), passed: passed,
		log: r.lastLog, junit: filepath.Join(c.out, "junit_01.xml"), product: c.product,
		plinthVersion: version, nodes: c.clusterNodes, memoryMiB: c.memoryMiB,
	})
	if err != nil {
		fmt.Printf("conformance: %v\n", err)
		return
	}
	fmt.Printf("conformance: certification submission in %s (not submitted)\n", dir)
}
