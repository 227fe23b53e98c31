// Package event defines Values: variables whose changes can be watched.
//
// A service publishes its state (for example "etcd is running, here is a
// client") by Setting a Value; any number of consumers each hold a Watcher
// and call Get to wait for the next state they care about. Only the latest
// state matters, so a slow watcher may skip intermediate values instead of
// queueing them: nobody ever blocks a setter.
//
// The in-memory implementation lives in the memory subpackage. Other
// implementations (e.g. backed by etcd) can reuse GetOption through Match.
package event

import (
	"context"
	"errors"
)

// Value is a variable that can be watched: every change reaches each watcher.
type Value[T any] interface {
	// Set replaces the value and wakes up all watchers.
	Set(val T)
	// Watch returns a new Watcher that has not yet returned any value.
	Watch() Watcher[T]
}

// Watcher observes one Value.
type Watcher[T any] interface {
	// Get blocks until the Value has a value this watcher has not returned
	// yet (the first call returns the current value at once if one was ever
	// Set) that passes every option's filter; returns ctx.Err() when ctx
	// ends. Intermediate values may be skipped (only the latest matters).
	// Values rejected by a filter count as seen: Get then waits for a newer
	// one. After Close, Get returns ErrClosed.
	Get(ctx context.Context, opts ...GetOption[T]) (T, error)
	// Close releases the watcher and makes pending and future Gets return
	// ErrClosed. Closing twice is harmless.
	Close() error
}

// ErrClosed is returned by Get on a Watcher that has been closed.
var ErrClosed = errors.New("event: watcher closed")

// GetOption modifies a single Watcher.Get call.
type GetOption[T any] struct {
	filter func(T) bool
}

// Filter makes Get skip values for which pred returns false. It is typically
// declared once next to the value type, e.g.
//
//	var FilterRunning = event.Filter(func(st *Status) bool { return st.Running() })
func Filter[T any](pred func(T) bool) GetOption[T] {
	return GetOption[T]{filter: pred}
}

// Match reports whether val passes this option. It exists so that Watcher
// implementations outside this package can apply options they cannot
// otherwise inspect.
func (o GetOption[T]) Match(val T) bool {
	return o.filter == nil || o.filter(val)
}

// MatchAll reports whether val passes every option in opts.
func MatchAll[T any](opts []GetOption[T], val T) bool {
	for _, o := range opts {
		if !o.Match(val) {
			return false
		}
	}
	return true
}
