package launch

import (
	"slices"
	"sync"
	"time"
)

// rdtsc reads this CPU's time-stamp counter (tsc_amd64.s).
func rdtsc() uint64

// hostTSCkHz is the host's TSC rate in kHz, measured once (a few hundred
// milliseconds); 0 if it cannot be measured.
var hostTSCkHz = sync.OnceValue(measureTSCkHz)

// measureTSCkHz times the TSC against the monotonic clock: the median of
// three 50 ms spans, each end the tightest of several clock readings
// around an RDTSC, so that being preempted between the two readings
// costs nothing.
func measureTSCkHz() uint64 {
	sample := func() (uint64, time.Time) {
		var tsc uint64
		var at time.Time
		best := time.Duration(1<<63 - 1)
		for range 8 {
			a := time.Now()
			c := rdtsc()
			w := time.Since(a)
			if w < best {
				best, tsc, at = w, c, a.Add(w/2)
			}
		}
		return tsc, at
	}
	var rates []uint64
	for range 3 {
		c0, t0 := sample()
		time.Sleep(50 * time.Millisecond)
		c1, t1 := sample()
		ns := uint64(t1.Sub(t0).Nanoseconds())
		if c1 <= c0 || ns == 0 {
			return 0
		}
		rates = append(rates, (c1-c0)*1_000_000/ns)
	}
	slices.Sort(rates)
	return rates[1]
}
