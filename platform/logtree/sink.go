package logtree

import (
	"fmt"
	"io"
	"log/slog"
	"strings"
	"time"
)

// A sink is a writer that receives entries as console lines. Writing to
// it never holds up logging: entries go through a bounded queue to a
// goroutine of its own, so a slow sink — a serial console under
// emulation writes a few kB per second — cannot block the runnables
// (or the child processes whose output they log). When the queue is
// full, entries are dropped and the sink is told how many were.
type sink struct {
	w     io.Writer
	keep  func(Entry) bool
	queue chan []byte
	flush chan chan struct{}
	// dropped is written under the tree's lock.
	dropped int
}

// sinkQueue is how many lines a sink may be behind before it drops.
const sinkQueue = 8192

// AddSink makes every further entry that keep accepts (nil: every entry)
// also go to w as one line, without ever blocking the logger (see sink).
func (t *Tree) AddSink(w io.Writer, keep func(Entry) bool) {
	s := &sink{w: w, keep: keep, queue: make(chan []byte, sinkQueue), flush: make(chan chan struct{})}
	go s.run()
	t.mu.Lock()
	t.sinks = append(t.sinks, s)
	t.mu.Unlock()
}

// offer queues line for the sink; t.mu is held.
func (s *sink) offer(e Entry, line []byte) {
	if s.keep != nil && !s.keep(e) {
		return
	}
	if s.dropped > 0 {
		note := Entry{Time: e.Time, Level: slog.LevelWarn, DN: "logtree", Message: fmt.Sprintf("%d log lines not written here: this output was too slow (they are in the node's log buffer)", s.dropped)}
		select {
		case s.queue <- []byte(note.String() + "\n"):
			s.dropped = 0
		default:
		}
	}
	select {
	case s.queue <- line:
	default:
		s.dropped++
	}
}

func (s *sink) run() {
	for {
		select {
		case line := <-s.queue:
			// A sink that fails (console gone) must not stop logging to
			// the others.
			_, _ = s.w.Write(line)
		case done := <-s.flush:
			for {
				select {
				case line := <-s.queue:
					_, _ = s.w.Write(line)
					continue
				default:
				}
				break
			}
			close(done)
		}
	}
}

// Flush waits until every sink has written what was logged before, at
// most timeout (the last lines before a power-off must reach the
// console).
func (t *Tree) Flush(timeout time.Duration) {
	t.mu.Lock()
	sinks := append([]*sink(nil), t.sinks...)
	t.mu.Unlock()
	deadline := time.After(timeout)
	for _, s := range sinks {
		done := make(chan struct{})
		select {
		case s.flush <- done:
		case <-deadline:
			return
		}
		select {
		case <-done:
		case <-deadline:
			return
		}
	}
}

// NotProcessOutput keeps a sink to the node's own lines and to what child
// processes report as errors: their other output (ProcessOutputSuffix
// DNs) stays in the log buffer.
func NotProcessOutput(e Entry) bool {
	return !strings.HasSuffix(e.DN, ProcessOutputSuffix) || e.Level >= slog.LevelError
}

// ProcessOutputSuffix ends the DN under which a runnable logs the output
// of its child process ("root.roleserver.kubernetes.worker.kubelet.out").
const ProcessOutputSuffix = ".out"
