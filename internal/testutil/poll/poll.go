// Package poll waits in tests for a condition that other goroutines or
// processes make true: a real etcd member electing itself, a curator
// answering, a node reporting in.
package poll

import (
	"testing"
	"time"
)

// Interval is how often Until tries again.
const Interval = 50 * time.Millisecond

// Until calls f until it returns nil, and fails tb with what and f's
// last error if that has not happened within timeout.
func Until(tb testing.TB, timeout time.Duration, what string, f func() error) {
	tb.Helper()
	deadline := time.Now().Add(timeout)
	for {
		err := f()
		if err == nil {
			return
		}
		if time.Now().After(deadline) {
			tb.Fatalf("%s: still failing after %v: %v", what, timeout, err)
		}
		time.Sleep(Interval)
	}
}
