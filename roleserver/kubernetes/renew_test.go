package kubernetes

import (
	"context"
	"errors"
	"testing"
	"time"
)

// TestRenewWhenDue: nothing is asked before the due time; failures are
// retried (and reported) until the issuer answers; a stopped worker
// stops asking.
func TestRenewWhenDue(t *testing.T) {
	due := time.Now().Add(50 * time.Millisecond)
	var calls, failures int
	var first time.Time
	got, err := renewWhenDue(context.Background(), due, time.Millisecond, func(context.Context) (string, error) {
		if calls++; calls == 1 {
			first = time.Now()
		}
		if calls < 3 {
			return "", errors.New("curator unreachable")
		}
		return "new", nil
	}, func(error) { failures++ })
	if err != nil || got != "new" || calls != 3 || failures != 2 {
		t.Fatalf("renewWhenDue: %q, %v after %d calls, %d failures; want new after 3 calls, 2 failures", got, err, calls, failures)
	}
	if first.Before(due) {
		t.Errorf("asked at %v, before the due time %v", first, due)
	}

	ctx, cancel := context.WithCancel(context.Background())
	time.AfterFunc(20*time.Millisecond, cancel)
	_, err = renewWhenDue(ctx, time.Now(), time.Millisecond, func(context.Context) (string, error) {
		return "", errors.New("curator unreachable")
	}, func(error) {})
	if !errors.Is(err, context.Canceled) {
		t.Errorf("after the worker stopped: %v, want context.Canceled", err)
	}
}
