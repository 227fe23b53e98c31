package supervisor

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"plinth.dev/plinth/platform/logtree"
)

func fastOpts() Options {
	return Options{InitialBackoff: 10 * time.Millisecond, MaxBackoff: 80 * time.Millisecond}
}

func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

func stateOf(s *Supervisor, dn string) State {
	for _, st := range s.Snapshot() {
		if st.DN == dn {
			return st.State
		}
	}
	return ""
}

func TestTreeBecomesHealthy(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	lt := logtree.New(100)
	s := New(ctx, lt, func(ctx context.Context) error {
		for _, name := range []string{"a", "b"} {
			if err := Run(ctx, name, func(ctx context.Context) error {
				Logger(ctx).Info("serving")
				Signal(ctx, SignalHealthy)
				<-ctx.Done()
				return ctx.Err()
			}); err != nil {
				return err
			}
		}
		Signal(ctx, SignalHealthy)
		<-ctx.Done()
		return ctx.Err()
	}, fastOpts())
	wctx, wcancel := context.WithTimeout(ctx, 5*time.Second)
	defer wcancel()
	if err := s.WaitHealthy(wctx); err != nil {
		t.Fatalf("tree never healthy: %v", err)
	}
	if got := len(s.Snapshot()); got != 3 {
		t.Fatalf("want 3 runnables, got %d: %v", got, s.Snapshot())
	}
	if es := lt.Read("root.a", 0); len(es) != 1 || es[0].Message != "serving" {
		t.Fatalf("child log not under its DN: %v", es)
	}
	cancel()
	done := make(chan struct{})
	go func() { s.Wait(); close(done) }()
	select {
	case <-done:
	case <-time.After(5 * time.Second):
		t.Fatal("shutdown did not finish")
	}
	for _, st := range s.Snapshot() {
		if st.State != StateStopped {
			t.Errorf("%s: state %s after shutdown", st.DN, st.State)
		}
	}
}

func TestRestartWithBackoffCancelsChildren(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	var parentRuns, childStops atomic.Int32
	var starts []time.Time
	startCh := make(chan time.Time, 100)
	s := New(ctx, logtree.New(100), func(ctx context.Context) error {
		return Run(ctx, "flaky", func(ctx context.Context) error {
			startCh <- time.Now()
			n := parentRuns.Add(1)
			if err := Run(ctx, "child", func(ctx context.Context) error {
				<-ctx.Done()
				childStops.Add(1)
				return ctx.Err()
			}); err != nil {
				return err
			}
			if n < 4 {
				return errors.New("boom")
			}
			Signal(ctx, SignalHealthy)
			<-ctx.Done()
			return ctx.Err()
		})
	}, fastOpts())
	waitFor(t, "fourth start to become healthy", func() bool { return stateOf(s, "root.flaky") == StateHealthy })
	close(startCh)
	for ts := range startCh {
		starts = append(starts, ts)
	}
	if len(starts) != 4 {
		t.Fatalf("want 4 starts, got %d", len(starts))
	}
	// Backoffs 10, 20, 40 ms: each gap must be at least the backoff.
	for i, want := range []time.Duration{10, 20, 40} {
		if gap := starts[i+1].Sub(starts[i]); gap < want*time.Millisecond {
			t.Errorf("restart %d after %v, want >= %v ms", i+1, gap, want)
		}
	}
	if got := childStops.Load(); got != 3 {
		t.Errorf("children of failed runs must be cancelled: %d stopped, want 3", got)
	}
	for _, st := range s.Snapshot() {
		if st.DN == "root.flaky" && (st.Restarts != 3 || st.LastErr != "boom") {
			t.Errorf("status %+v, want 3 restarts, last error boom", st)
		}
	}
}

func TestPanicIsRestarted(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	var runs atomic.Int32
	lt := logtree.New(100)
	s := New(ctx, lt, func(ctx context.Context) error {
		if runs.Add(1) == 1 {
			panic("kaboom")
		}
		Signal(ctx, SignalHealthy)
		<-ctx.Done()
		return nil
	}, fastOpts())
	waitFor(t, "healthy after panic", s.Healthy)
	found := false
	for _, e := range lt.Read("root", 0) {
		if strings.Contains(e.String(), "kaboom") {
			found = true
		}
	}
	if !found {
		t.Error("panic was not logged")
	}
}

func TestDoneKeepsChildren(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	s := New(ctx, logtree.New(100), func(ctx context.Context) error {
		if err := Run(ctx, "worker", func(ctx context.Context) error {
			Signal(ctx, SignalHealthy)
			<-ctx.Done()
			return ctx.Err()
		}); err != nil {
			return err
		}
		Signal(ctx, SignalDone)
		return nil
	}, fastOpts())
	waitFor(t, "root done, worker healthy", func() bool {
		return stateOf(s, "root") == StateDone && stateOf(s, "root.worker") == StateHealthy
	})
	if !s.Healthy() {
		t.Error("a done runnable with healthy children counts as healthy")
	}
}

func TestRunRejectsBadNames(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	errs := make(chan error, 3)
	New(ctx, logtree.New(10), func(ctx context.Context) error {
		noop := func(ctx context.Context) error { <-ctx.Done(); return nil }
		errs <- Run(ctx, "a.b", noop)
		errs <- Run(ctx, "x", noop)
		errs <- Run(ctx, "x", noop)
		<-ctx.Done()
		return nil
	}, fastOpts())
	if err := <-errs; err == nil {
		t.Error("dotted name accepted")
	}
	if err := <-errs; err != nil {
		t.Errorf("valid name refused: %v", err)
	}
	if err := <-errs; err == nil {
		t.Error("duplicate name accepted")
	}
	if err := Run(context.Background(), "x", nil); err == nil {
		t.Error("Run outside a runnable accepted")
	}
}

func TestRequestedRestartIsNotAFailure(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	var runs, childStops atomic.Int32
	lt := logtree.New(100)
	s := New(ctx, lt, func(ctx context.Context) error {
		return Run(ctx, "member", func(ctx context.Context) error {
			n := runs.Add(1)
			if err := Run(ctx, "etcd", func(ctx context.Context) error {
				<-ctx.Done()
				childStops.Add(1)
				return ctx.Err()
			}); err != nil {
				return err
			}
			if n == 1 {
				return fmt.Errorf("role changed: %w", ErrRestart)
			}
			Signal(ctx, SignalHealthy)
			<-ctx.Done()
			return ctx.Err()
		})
	}, fastOpts())
	waitFor(t, "second run to become healthy", func() bool { return stateOf(s, "root.member") == StateHealthy })
	if runs.Load() != 2 || childStops.Load() != 1 {
		t.Fatalf("runs %d, child stops %d; want 2 and 1", runs.Load(), childStops.Load())
	}
	for _, st := range s.Snapshot() {
		if st.DN == "root.member" && (st.Restarts != 0 || st.LastErr != "") {
			t.Errorf("a requested restart counted as a failure: %+v", st)
		}
	}
}

// TestSnapshotThroughContext: a runnable reads the whole tree's status
// through its own context, the same as Supervisor.Snapshot; outside a
// tree there is none.
func TestSnapshotThroughContext(t *testing.T) {
	if st := Snapshot(context.Background()); st != nil {
		t.Fatalf("snapshot outside a tree: %v", st)
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	seen := make(chan []Status, 1)
	s := New(ctx, logtree.New(100), func(ctx context.Context) error {
		if err := Run(ctx, "sibling", func(ctx context.Context) error {
			Signal(ctx, SignalHealthy)
			<-ctx.Done()
			return ctx.Err()
		}); err != nil {
			return err
		}
		return Run(ctx, "reader", func(ctx context.Context) error {
			Signal(ctx, SignalHealthy)
			for {
				st := Snapshot(ctx)
				if len(st) == 3 && st[1].State == StateHealthy && st[2].State == StateHealthy {
					seen <- st
					<-ctx.Done()
					return ctx.Err()
				}
				time.Sleep(5 * time.Millisecond)
			}
		})
	}, fastOpts())
	var got []Status
	select {
	case got = <-seen:
	case <-time.After(10 * time.Second):
		t.Fatal("the reader never saw the whole tree")
	}
	var dns []string
	for _, st := range got {
		dns = append(dns, st.DN)
	}
	if strings.Join(dns, ",") != "root,root.reader,root.sibling" {
		t.Fatalf("snapshot through the context: %v", dns)
	}
	if len(s.Snapshot()) != len(got) {
		t.Fatalf("Supervisor.Snapshot has %d runnables, the context's %d", len(s.Snapshot()), len(got))
	}
}
