package poll

import (
	"errors"
	"fmt"
	"runtime"
	"testing"
	"time"
)

// TestUntil: a condition that becomes true is waited for; one that never
// does fails the test with its last error.
func TestUntil(t *testing.T) {
	n := 0
	Until(t, time.Second, "third try", func() error {
		if n++; n < 3 {
			return errors.New("not yet")
		}
		return nil
	})
	if n != 3 {
		t.Errorf("f called %d times, want 3", n)
	}
	ft := &fatalT{TB: t}
	done := make(chan struct{})
	go func() {
		defer close(done)
		Until(ft, 120*time.Millisecond, "never", func() error { return errors.New("still no") })
	}()
	<-done
	if ft.msg != "never: still failing after 120ms: still no" {
		t.Errorf("failure: %q", ft.msg)
	}
}

// fatalT records Fatalf and ends its goroutine, as testing.T does.
type fatalT struct {
	testing.TB
	msg string
}

func (f *fatalT) Helper() {}

func (f *fatalT) Fatalf(format string, args ...any) {
	f.msg = fmt.Sprintf(format, args...)
	runtime.Goexit()
}
