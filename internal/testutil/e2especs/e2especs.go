// Package e2especs is what the two that run the upstream end-to-end
// suite (e2e.test, package conformance) share: the conformance runner
// (conformance/run, `make conformance`) and the VM test's conformance
// smoke (vmtest, `make test`). The suite's flags for a Plinth cluster,
// the specs to run by name, and what it reports of a run:
//
//	SuiteFlags ──► e2e.test -- …
//	NAMES file ──ReadNames──► names ──NamesFocus──► ginkgo --focus
//	e2e.test ──PLINTH_CONFORMANCE_PROGRESS──► progress.jsonl ──ReadProgress──► []Spec
//	ginkgo -v's log ──SuiteVersion──► the suite's Kubernetes version
package e2especs

import (
	"bufio"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"regexp"
	"strings"
)

// ProgressEnv names the file every e2e.test process appends a JSON line
// to per finished spec (conformance/progress_test.go).
const ProgressEnv = "PLINTH_CONFORMANCE_PROGRESS"

// SuiteFlags are the suite's flags for a Plinth cluster: the local
// provider (no cloud), the project's kubectl, the report in reportDir, no
// log dump (it would ssh into nodes, which have no shell), and of the
// framework's dump after a failed spec only the events of its namespace
// (lines "At … - event for POD: …"), not every node's description.
func SuiteFlags(kubeconfig, kubectl, reportDir string) []string {
	return []string{"--provider=local", "--kubeconfig=" + kubeconfig, "--kubectl-path=" + kubectl,
		"--report-dir=" + reportDir, "--max-nodes-to-gather-from=0", "--disable-log-dump"}
}

// Spec is one progress line.
type Spec struct {
	State   string  `json:"state"`
	Seconds float64 `json:"seconds"`
	Name    string  `json:"name"`
	Failure string  `json:"failure"`
}

// Outcome is "passed", "skipped" (ginkgo's states) or "failed": every
// other state (failed, panicked, interrupted, timedout, aborted) is a
// failure.
func (s Spec) Outcome() string {
	switch s.State {
	case "passed", "skipped":
		return s.State
	}
	return "failed"
}

// ReadProgress reads a progress file; lines that are not a spec's (a
// partial last line) are left out.
func ReadProgress(path string) ([]Spec, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	var specs []Spec
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	for sc.Scan() {
		var s Spec
		if json.Unmarshal(sc.Bytes(), &s) == nil && s.Name != "" {
			specs = append(specs, s)
		}
	}
	return specs, sc.Err()
}

// ReadNames reads a NAMES file: one spec's full name per line (as the
// progress lines print them); lines beginning with # are comments.
func ReadNames(path string) ([]string, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	var names []string
	for _, l := range strings.Split(string(b), "\n") {
		if l = strings.TrimSpace(l); l != "" && !strings.HasPrefix(l, "#") {
			names = append(names, l)
		}
	}
	if len(names) == 0 {
		return nil, fmt.Errorf("%s names no spec", path)
	}
	return names, nil
}

// NamesFocus is a focus matching exactly the named specs. ginkgo
// matches a focus against the suite's description, a space and the
// spec's full name ("Kubernetes e2e suite [sig-node] Pods …"), so a name
// is anchored at the end and after a space; every name begins with its
// "[sig-…]", so none is another's tail.
func NamesFocus(names []string) string {
	q := make([]string, len(names))
	for i, n := range names {
		q[i] = regexp.QuoteMeta(n)
	}
	return " (" + strings.Join(q, "|") + ")$"
}

// versionLine is the line the suite logs before its first spec, which
// the CNCF conformance repository's checks read from a submission's log.
var versionLine = regexp.MustCompile(`e2e test version: (v1\.[0-9]+)(\.[0-9]+)?\s*$`)

// ErrNoSuiteVersion: the log names no suite version (ginkgo shows the
// suite's setup output only with -v).
var ErrNoSuiteVersion = errors.New("the log names no e2e test version")

// SuiteVersion is the Kubernetes version of the suite whose ginkgo log
// is at path (v1.37.2) and its minor version (v1.37).
func SuiteVersion(path string) (version, minor string, err error) {
	f, err := os.Open(path)
	if err != nil {
		return "", "", err
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	for sc.Scan() {
		if m := versionLine.FindStringSubmatch(sc.Text()); m != nil {
			return m[1] + m[2], m[1], nil
		}
	}
	if err := sc.Err(); err != nil {
		return "", "", err
	}
	return "", "", fmt.Errorf("%s: %w", path, ErrNoSuiteVersion)
}
