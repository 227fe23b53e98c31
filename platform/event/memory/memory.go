// Package memory implements event.Value in memory, for state shared between
// goroutines of one process.
//
//	Set(v) ──► Value{ value, generation++ } ──close(changed)──► wakes all Gets
//	                     │
//	                     ├──► Watcher A: Get returns value if generation > last seen by A
//	                     └──► Watcher B: Get returns value if generation > last seen by B
//
// Every Set bumps a generation counter and closes a broadcast channel that is
// replaced by a fresh one. A watcher only remembers the last generation it
// returned; Get hands out the current value when it is newer, otherwise
// waits on the channel. Setters never wait for watchers, and a slow watcher
// simply sees the latest value, skipping intermediate ones.
package memory

import (
	"context"
	"sync"

	"plinth.dev/plinth/platform/event"
)

// Value is an in-memory event.Value; its zero value is ready to use (no
// constructor needed), safe for concurrent use. It must not be copied after
// first use.
type Value[T any] struct {
	mu sync.Mutex
	// value is the latest value Set, valid when gen > 0.
	value T
	// gen counts Sets; 0 means never Set.
	gen uint64
	// changed is closed (and replaced) by the next Set. Created lazily so
	// that the zero Value works.
	changed chan struct{}
}

var _ event.Value[int] = (*Value[int])(nil)

// Set replaces the value and wakes every watcher blocked in Get.
func (v *Value[T]) Set(val T) {
	v.mu.Lock()
	defer v.mu.Unlock()
	v.value = val
	v.gen++
	if v.changed != nil {
		close(v.changed)
		v.changed = nil
	}
}

// Watch returns a new watcher that has seen nothing yet: its first Get
// returns the current value at once if one was ever Set.
func (v *Value[T]) Watch() event.Watcher[T] {
	return &watcher[T]{v: v, done: make(chan struct{})}
}

// waitChan returns the channel the next Set will close. Caller holds v.mu.
func (v *Value[T]) waitChan() chan struct{} {
	if v.changed == nil {
		v.changed = make(chan struct{})
	}
	return v.changed
}

type watcher[T any] struct {
	v *Value[T]
	// seen is the last generation returned or rejected by a filter.
	// Guarded by v.mu so that Gets from several goroutines do not race.
	seen uint64

	closeOnce sync.Once
	done      chan struct{}
}

func (w *watcher[T]) Get(ctx context.Context, opts ...event.GetOption[T]) (T, error) {
	var zero T
	for {
		select {
		case <-w.done:
			return zero, event.ErrClosed
		default:
		}
		if err := ctx.Err(); err != nil {
			return zero, err
		}

		w.v.mu.Lock()
		if w.v.gen > w.seen {
			val := w.v.value
			w.seen = w.v.gen
			w.v.mu.Unlock()
			// Filters run without the lock: they are user code and may be
			// slow or even touch the Value.
			if event.MatchAll(opts, val) {
				return val, nil
			}
			continue
		}
		ch := w.v.waitChan()
		w.v.mu.Unlock()

		select {
		case <-ch:
		case <-ctx.Done():
			return zero, ctx.Err()
		case <-w.done:
			return zero, event.ErrClosed
		}
	}
}

func (w *watcher[T]) Close() error {
	w.closeOnce.Do(func() { close(w.done) })
	return nil
}
