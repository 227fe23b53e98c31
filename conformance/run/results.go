package main

import (
	"fmt"
	"io"
	"os"
	"slices"
	"strings"
	"time"

	"plinth.dev/plinth/internal/testutil/e2especs"
)

// results are the finished specs of a run, from its progress file.
type results struct {
	path        string
	specs       []e2especs.Spec // the latest outcome of each name, in order of finishing
	seen        int             // lines of path read
	interrupted map[string]int  // times each name was interrupted
	reason      string          // why the runner interrupted the current attempt ("" if it did not)
	seed        int64           // the specs' order (ginkgo's seed), printed with the summary
	out         io.Writer       // the progress lines
}

// maxInterrupts is how often a spec is interrupted before it counts as
// hanging: once may be another spec's stall (ginkgo interrupts all that
// run), twice is its own.
const maxInterrupts = 2

func newResults(path string) *results {
	os.Remove(path)
	return &results{path: path, interrupted: map[string]int{}, out: os.Stdout}
}

// poll reads the lines added since the last poll and prints each as
// "[n/planned] outcome time name", n counted on from before (the
// attempt's specs finished so far); it returns how many there were.
func (r *results) poll(planned, before int) int {
	all, err := e2especs.ReadProgress(r.path)
	if err != nil || len(all) <= r.seen {
		return 0
	}
	fresh := all[r.seen:]
	r.seen = len(all)
	for i, s := range fresh {
		// A spec run again (a later round) replaces its earlier outcome.
		r.specs = slices.DeleteFunc(r.specs, func(o e2especs.Spec) bool { return o.Name == s.Name })
		if s.State == "interrupted" {
			r.interrupted[s.Name]++
			if r.reason != "" {
				s.Failure += " (" + r.reason + ")"
			}
		}
		r.specs = append(r.specs, s)
		fmt.Fprintf(r.out, "[%d/%d] %-7s %6.1fs %s\n", before+i+1, planned, s.Outcome(), s.Seconds, s.Name)
		if s.Failure != "" && s.Outcome() == "failed" {
			fmt.Fprintf(r.out, "          %s\n", s.Failure)
		}
	}
	return len(fresh)
}

// missing are the names to run again: never finished, or interrupted
// fewer than maxInterrupts times.
func (r *results) missing(names []string) []string {
	return r.without(names, func(s e2especs.Spec) bool {
		return s.State != "interrupted" || r.interrupted[s.Name] >= maxInterrupts
	})
}

// unfinished are the names no spec finished under.
func (r *results) unfinished(names []string) []string {
	return r.without(names, func(e2especs.Spec) bool { return true })
}

// without are names but those with an outcome that counts.
func (r *results) without(names []string, counts func(e2especs.Spec) bool) []string {
	done := map[string]bool{}
	for _, s := range r.specs {
		if counts(s) {
			done[s.Name] = true
		}
	}
	var left []string
	for _, n := range names {
		if !done[n] {
			left = append(left, n)
		}
	}
	return left
}

// summary prints the counts and every failure with its first line, and
// writes the same to file; failed reports whether a spec failed.
// planned are the names the rounds selected: those that never finished
// are listed as not run (and fail the run).
func (r *results) summary(w io.Writer, file string, wall time.Duration, planned []string) (failed bool, err error) {
	var b strings.Builder
	n := map[string]int{}
	for _, s := range r.specs {
		n[s.Outcome()]++
	}
	notRun := r.unfinished(planned)
	fmt.Fprintf(&b, "conformance: %d passed, %d failed, %d skipped, %d not run in %v\n", n["passed"], n["failed"], n["skipped"], len(notRun), wall.Round(time.Second))
	for _, name := range notRun {
		fmt.Fprintf(&b, "  NOT RUN %s\n", name)
	}
	for _, s := range r.specs {
		if s.Outcome() == "failed" {
			fmt.Fprintf(&b, "  FAIL %s\n       %s: %s\n", s.Name, s.State, s.Failure)
		}
	}
	if r.seed != 0 {
		fmt.Fprintf(&b, "conformance: the specs ran in the order of seed %d (-seed %d runs them in that order again)\n", r.seed, r.seed)
	}
	fmt.Fprint(w, b.String())
	return n["failed"]+len(notRun) > 0, os.WriteFile(file, []byte(b.String()), 0o644)
}
