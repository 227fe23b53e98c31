package memory

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"

	"plinth.dev/plinth/platform/event"
)

// mustBlock asserts that Get does not return within a short time.
func mustBlock[T any](t *testing.T, w event.Watcher[T], opts ...event.GetOption[T]) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
	defer cancel()
	v, err := w.Get(ctx, opts...)
	if !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("Get returned (%v, %v), want it to block", v, err)
	}
}

func TestFirstGetReturnsCurrent(t *testing.T) {
	var v Value[int]
	v.Set(1)
	v.Set(2)
	w := v.Watch()
	defer w.Close()
	got, err := w.Get(context.Background())
	if err != nil || got != 2 {
		t.Fatalf("Get = (%d, %v), want (2, nil)", got, err)
	}
	// Already returned: the next Get waits for a new Set.
	mustBlock(t, w)
}

func TestGetBlocksUntilSet(t *testing.T) {
	var v Value[string]
	v.Set("a")
	w := v.Watch()
	defer w.Close()
	if got, _ := w.Get(context.Background()); got != "a" {
		t.Fatalf("got %q", got)
	}
	res := make(chan string)
	go func() {
		got, err := w.Get(context.Background())
		if err != nil {
			t.Errorf("Get: %v", err)
		}
		res <- got
	}()
	select {
	case got := <-res:
		t.Fatalf("Get returned %q before Set", got)
	case <-time.After(50 * time.Millisecond):
	}
	v.Set("b")
	select {
	case got := <-res:
		if got != "b" {
			t.Fatalf("got %q, want b", got)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("Get did not return after Set")
	}
}

func TestWatchBeforeAnySet(t *testing.T) {
	var v Value[*int]
	w := v.Watch()
	defer w.Close()
	mustBlock(t, w)
	x := 7
	v.Set(&x)
	got, err := w.Get(context.Background())
	if err != nil || got != &x {
		t.Fatalf("Get = (%v, %v)", got, err)
	}
}

func TestSameValueSetTwiceIsNewEvent(t *testing.T) {
	var v Value[int]
	w := v.Watch()
	defer w.Close()
	v.Set(1)
	w.Get(context.Background())
	v.Set(1)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if got, err := w.Get(ctx); err != nil || got != 1 {
		t.Fatalf("Get = (%d, %v)", got, err)
	}
}

func TestFilter(t *testing.T) {
	var v Value[int]
	even := event.Filter(func(i int) bool { return i%2 == 0 })
	positive := event.Filter(func(i int) bool { return i > 0 })
	v.Set(1)
	w := v.Watch()
	defer w.Close()
	// 1 is odd: skipped, and Get waits.
	mustBlock(t, w, even)

	res := make(chan int)
	go func() {
		got, err := w.Get(context.Background(), even, positive)
		if err != nil {
			t.Errorf("Get: %v", err)
		}
		res <- got
	}()
	time.Sleep(10 * time.Millisecond)
	v.Set(3)  // odd
	v.Set(-2) // not positive
	time.Sleep(10 * time.Millisecond)
	v.Set(4)
	select {
	case got := <-res:
		if got != 4 {
			t.Fatalf("got %d, want 4", got)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("filtered Get did not return")
	}

	// A fresh watcher gets a current value that passes the filter at once.
	w2 := v.Watch()
	defer w2.Close()
	if got, err := w2.Get(context.Background(), even); err != nil || got != 4 {
		t.Fatalf("Get = (%d, %v)", got, err)
	}
}

func TestContextCancel(t *testing.T) {
	var v Value[int]
	w := v.Watch()
	defer w.Close()
	ctx, cancel := context.WithCancel(context.Background())
	errc := make(chan error)
	go func() {
		_, err := w.Get(ctx)
		errc <- err
	}()
	time.Sleep(10 * time.Millisecond)
	cancel()
	select {
	case err := <-errc:
		if !errors.Is(err, context.Canceled) {
			t.Fatalf("err = %v, want context.Canceled", err)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("Get ignored cancellation")
	}
	// An already cancelled context wins even when a value is available.
	v.Set(1)
	if _, err := w.Get(ctx); !errors.Is(err, context.Canceled) {
		t.Fatalf("err = %v, want context.Canceled", err)
	}
	// The watcher still works with a live context.
	if got, err := w.Get(context.Background()); err != nil || got != 1 {
		t.Fatalf("Get = (%d, %v)", got, err)
	}
}

func TestClose(t *testing.T) {
	var v Value[int]
	w := v.Watch()
	errc := make(chan error)
	go func() {
		_, err := w.Get(context.Background())
		errc <- err
	}()
	time.Sleep(10 * time.Millisecond)
	if err := w.Close(); err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-errc:
		if !errors.Is(err, event.ErrClosed) {
			t.Fatalf("pending Get err = %v, want ErrClosed", err)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("Close did not unblock Get")
	}
	v.Set(1)
	if _, err := w.Get(context.Background()); !errors.Is(err, event.ErrClosed) {
		t.Fatalf("Get after Close err = %v, want ErrClosed", err)
	}
	if err := w.Close(); err != nil {
		t.Fatalf("second Close: %v", err)
	}
}

// TestConcurrent runs many setters and watchers at once. Each watcher must
// see every setter's values in order (skipping is fine, going back is not)
// and must always end up with the latest value: a sentinel Set after all
// setters finished.
func TestConcurrent(t *testing.T) {
	const (
		setters  = 8
		watchers = 32
		perSet   = 500
	)
	type item struct{ setter, n int }
	var v Value[item]
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()

	var wg sync.WaitGroup
	for i := 0; i < watchers; i++ {
		w := v.Watch()
		wg.Add(1)
		go func() {
			defer wg.Done()
			defer w.Close()
			last := make([]int, setters)
			for {
				got, err := w.Get(ctx)
				if err != nil {
					t.Errorf("Get: %v", err)
					return
				}
				if got.setter == -1 {
					return
				}
				if got.n < last[got.setter] {
					t.Errorf("setter %d went back from %d to %d", got.setter, last[got.setter], got.n)
				}
				last[got.setter] = got.n
			}
		}()
	}
	var sw sync.WaitGroup
	for s := 0; s < setters; s++ {
		sw.Add(1)
		go func() {
			defer sw.Done()
			for n := 1; n <= perSet; n++ {
				v.Set(item{s, n})
			}
		}()
	}
	sw.Wait()
	v.Set(item{setter: -1})
	wg.Wait()
}
