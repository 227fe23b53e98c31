package supervisor

import (
	"context"
	"time"
)

// Sleep waits d, or until ctx ends (then it returns ctx's error): the
// wait between a runnable's retries.
func Sleep(ctx context.Context, d time.Duration) error {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}
