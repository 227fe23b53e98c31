package roleserver

// Reading the Service's event values. New sets every value (to nil where
// nothing is known yet), so get never blocks; wait waits for a non-nil one.

import (
	"context"

	"plinth.dev/plinth/api/clusterpb"
	"plinth.dev/plinth/platform/event"
	"plinth.dev/plinth/platform/event/memory"
)

var nonNilRoles = event.Filter(func(r *clusterpb.NodeRoles) bool { return r != nil })

// wait returns the first non-nil value of v.
func wait[T any](ctx context.Context, v *memory.Value[*T]) (*T, error) {
	w := v.Watch()
	defer w.Close()
	return w.Get(ctx, event.Filter(func(t *T) bool { return t != nil }))
}

// get returns the current value of v (set at New, so it never blocks).
func get[T any](v *memory.Value[T]) T {
	w := v.Watch()
	defer w.Close()
	t, _ := w.Get(context.Background())
	return t
}
