package roleserver

import (
	"context"
	"errors"
	"testing"
	"time"

	"plinth.dev/plinth/platform/event/memory"
)

// TestClusterKeyRequests: keep waits for the answer of whoever watches
// ClusterKey and returns its error; a request replaced before it was
// answered is answered for its watcher, so nobody waits for good.
func TestClusterKeyRequests(t *testing.T) {
	s := New(Config{})
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	sealErr := errors.New("TPM gone")
	answered := make(chan bool, 4)
	go func() {
		w := s.ClusterKey.Watch()
		defer w.Close()
		for {
			r, err := w.Get(ctx, NonNilClusterKey)
			if err != nil {
				return
			}
			answered <- r.Keep
			r.Done(sealErr)
		}
	}()
	if err := s.clusterKey.keep(ctx); !errors.Is(err, sealErr) {
		t.Fatalf("keep: %v, want the answer's error", err)
	}
	if keep := <-answered; !keep {
		t.Fatal("the watcher saw a drop, want a keep")
	}

	// Replaced before anyone answered it (no watcher here): the older
	// request is answered at once, the newer one is the value.
	var v memory.Value[*ClusterKeyRequest]
	c := &clusterKeyRequests{value: &v}
	first := c.ask(true)
	second := c.ask(false)
	if err := first.wait(ctx); !errors.Is(err, errSuperseded) {
		t.Fatalf("replaced request answered %v, want errSuperseded", err)
	}
	if got := get(&v); got != second || got.Keep {
		t.Fatalf("ClusterKey is %+v, want the drop", got)
	}
	second.Done(nil)
	second.Done(sealErr) // only the first answer counts
	if err := second.wait(ctx); err != nil {
		t.Fatalf("answered request: %v, want the first answer (nil)", err)
	}
}
