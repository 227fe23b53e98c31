package roleserver

// How the workers wait between attempts.

import (
	"context"
	"time"
)

// backoff is a retry delay doubling from 250ms up to 5s.
type backoff time.Duration

func (b *backoff) next() time.Duration {
	d := time.Duration(*b)
	if d == 0 {
		d = 250 * time.Millisecond
	}
	*b = backoff(min(2*d, 5*time.Second))
	return d
}

func (b *backoff) reset() { *b = 0 }

// retrySleep waits d before a retry at the curator leader, or less if the
// resolver learns of a new leader meanwhile: after a failover the retry
// goes there at once instead of after the backoff.
func retrySleep(ctx context.Context, conn *CuratorConnection, d time.Duration) error {
	changed := conn.Resolver.LeaderChanged()
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
	case <-changed:
	case <-ctx.Done():
		return ctx.Err()
	}
	return nil
}
