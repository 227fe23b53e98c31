package image

import (
	"fmt"
	"io"
	"time"
)

// progress prints a build's steps as they run:
//
//	[k/n] NAME ...
//	[k/n]   ... Ss: STATUS          (a long step's sign of life, see every)
//	[k/n] done in S.SSs: DETAIL     (or: [k/n] NAME FAILED after S.SSs: ERR)
//	build finished in S.SSs
//
// cmd/plinthbench reads the first and third forms for each step's time:
// keep them.
type progress struct {
	w     io.Writer
	n, of int
	start time.Time
}

func newProgress(w io.Writer, steps int) *progress {
	if w == nil {
		w = io.Discard
	}
	return &progress{w: w, of: steps, start: time.Now()}
}

func (p *progress) step(name string, fn func() (string, error)) error {
	p.n++
	fmt.Fprintf(p.w, "[%d/%d] %s ...\n", p.n, p.of, name)
	t := time.Now()
	detail, err := fn()
	if err != nil {
		fmt.Fprintf(p.w, "[%d/%d] %s FAILED after %.2fs: %v\n", p.n, p.of, name, time.Since(t).Seconds(), err)
		return fmt.Errorf("%s: %w", name, err)
	}
	fmt.Fprintf(p.w, "[%d/%d] done in %.2fs: %s\n", p.n, p.of, time.Since(t).Seconds(), detail)
	return nil
}

// every prints what status says every interval until the returned stop
// is called: a sign of life in a long step.
func (p *progress) every(interval time.Duration, status func() string) (stop func()) {
	done := make(chan struct{})
	finished := make(chan struct{})
	t := time.Now()
	go func() {
		defer close(finished)
		tick := time.NewTicker(interval)
		defer tick.Stop()
		for {
			select {
			case <-done:
				return
			case <-tick.C:
				fmt.Fprintf(p.w, "[%d/%d]   ... %.0fs: %s\n", p.n, p.of, time.Since(t).Seconds(), status())
			}
		}
	}()
	return func() { close(done); <-finished }
}

func (p *progress) done() {
	fmt.Fprintf(p.w, "build finished in %.2fs\n", time.Since(p.start).Seconds())
}
