//go:build built

package vmtest

import (
	"runtime"
	"slices"
	"sync"
	"testing"
	"time"
)

// parallel runs t in the parallel phase (see the package doc) once one of
// the host's slots (GOMAXPROCS: one TCG machine keeps a core busy) is
// free. About is how long the test takes under TCG on CI, measured: the
// longest waiting test starts first, so the phase ends soonest (longest
// processing time first). go test's own -parallel limit would start the
// tests in no particular order, so `make vmtest` lifts it and this pool
// decides; without -parallel the pool only ever sees go test's few.
func parallel(t *testing.T, about time.Duration) {
	t.Helper()
	t.Parallel()
	w := &poolWaiter{about: about, ready: make(chan struct{})}
	testPool.mu.Lock()
	if testPool.waiting == nil {
		testPool.free = runtime.GOMAXPROCS(0)
		// The parallel tests are released together: let them all arrive
		// before the first is chosen.
		time.AfterFunc(poolSettle, func() {
			testPool.mu.Lock()
			defer testPool.mu.Unlock()
			testPool.open = true
			testPool.grantLocked()
		})
	}
	testPool.waiting = append(testPool.waiting, w)
	testPool.grantLocked()
	testPool.mu.Unlock()
	<-w.ready
	t.Cleanup(func() {
		testPool.mu.Lock()
		defer testPool.mu.Unlock()
		testPool.free++
		testPool.grantLocked()
	})
}

// poolSettle is how long the pool waits for the parallel tests to arrive.
const poolSettle = 200 * time.Millisecond

// testPool is the slots of the parallel phase.
var testPool pool

type pool struct {
	mu      sync.Mutex
	open    bool // poolSettle passed
	free    int
	waiting []*poolWaiter // non-nil once the first test arrived
}

type poolWaiter struct {
	about time.Duration
	ready chan struct{}
}

// grantLocked starts the longest waiting tests while slots are free.
func (p *pool) grantLocked() {
	for p.open && p.free > 0 && len(p.waiting) > 0 {
		i := 0
		for k, w := range p.waiting {
			if w.about > p.waiting[i].about {
				i = k
			}
		}
		close(p.waiting[i].ready)
		p.waiting = slices.Delete(p.waiting, i, i+1)
		p.free--
	}
}
