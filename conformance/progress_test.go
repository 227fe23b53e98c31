//go:build conformance

package conformance

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strings"

	"github.com/onsi/ginkgo/v2"
	"github.com/onsi/ginkgo/v2/types"
)

// Progress for `make conformance` (conformance/run): when
// PLINTH_CONFORMANCE_PROGRESS names a file, every process of the run
// appends one JSON line per finished spec, which the runner prints as
// it comes ("[12/433] passed 9.1s [sig-node] …") and sums up at the
// end. One write per line with O_APPEND: the lines of parallel
// processes do not interleave.
//
// Registered by TestMain after the framework has read its flags: that
// runs ginkgo.PreviewSpecs, which puts back a clone of the suite made
// before it, holding only the top-level containers, so a top-level
// ReportAfterEach registered at package initialization (as upstream's
// own progress reporter is) never runs in the real run.
func registerProgress() {
	ginkgo.ReportAfterEach(reportProgress)
}

func reportProgress(r ginkgo.SpecReport) {
	p := os.Getenv("PLINTH_CONFORMANCE_PROGRESS")
	if p == "" || r.LeafNodeType != types.NodeTypeIt {
		return
	}
	// A spec the focus or skip filtered out is reported skipped, without
	// a message or a run time: not part of the run.
	if r.State == types.SpecStateSkipped && r.Failure.Message == "" && r.RunTime == 0 {
		return
	}
	msg := failureLine(r.Failure.Message, r.Failure.Location.FileName, r.Failure.Location.LineNumber)
	line, err := json.Marshal(struct {
		State   string  `json:"state"`
		Seconds float64 `json:"seconds"`
		Name    string  `json:"name"`
		Failure string  `json:"failure,omitempty"`
	}{State: r.State.String(), Seconds: r.RunTime.Seconds(), Name: r.FullText(), Failure: msg})
	if err != nil {
		return
	}
	f, err := os.OpenFile(p, os.O_WRONLY|os.O_APPEND|os.O_CREATE, 0o644)
	if err != nil {
		return
	}
	f.Write(append(line, '\n'))
	f.Close()
}

// failureLine is a failure's message on one line (gomega's run over
// several: "Expected", the value, the matcher), at most 300 bytes, and
// where the spec failed.
func failureLine(msg, file string, line int) string {
	msg = strings.Join(strings.Fields(msg), " ")
	if len(msg) > 300 {
		msg = strings.ToValidUTF8(msg[:300], "") + "…"
	}
	if file != "" && msg != "" {
		msg += fmt.Sprintf(" (%s:%d)", filepath.Base(file), line)
	}
	return msg
}
