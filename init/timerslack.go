package main

import (
	"fmt"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	"plinth.dev/plinth/platform/layout"
)

// maxTimerSlack bounds layout.TimerSlackArg: a timer may fire this much
// later than asked, in every process of the node.
const maxTimerSlack = 100 * time.Millisecond

// setTimerSlack gives every thread of the core the timer slack the
// command line names (layout.TimerSlackArg); the threads and processes
// the core starts later (etcd's, the Kubernetes components, containerd
// and its pods) inherit it. Without the argument the kernel's default
// stays.
//
// Why: a timer whose slack has not run out fires with any earlier one,
// so the node's many programs' timers (Go runtimes, each with its own
// sleeps and tickers) share interrupts and wake-ups instead of each
// taking its own. Under TCG a wake-up costs tens of microseconds of
// emulated interrupt entry, scheduling and address-space switch (the
// QEMU board's comment has the measurement).
func (b *boot) setTimerSlack() (string, error) {
	d, ok, err := timerSlack(b.args)
	if err != nil {
		return "", err
	}
	if !ok {
		return "the kernel's default", nil
	}
	// prctl sets the calling thread's slack only: every thread of the
	// runtime, as a thread inherits its creator's.
	if _, _, errno := syscall.AllThreadsSyscall(syscall.SYS_PRCTL, unix.PR_SET_TIMERSLACK, uintptr(d.Nanoseconds()), 0); errno != 0 {
		return "", fmt.Errorf("prctl(PR_SET_TIMERSLACK, %v): %w", d, errno)
	}
	return fmt.Sprintf("%v (%s=), for the core and all it starts", d, layout.TimerSlackArg), nil
}

// timerSlack is the timer slack args name; ok is false if they name
// none.
func timerSlack(args map[string]string) (d time.Duration, ok bool, err error) {
	v, ok := args[layout.TimerSlackArg]
	if !ok {
		return 0, false, nil
	}
	d, err = time.ParseDuration(v)
	if err != nil || d <= 0 || d > maxTimerSlack {
		return 0, true, fmt.Errorf("%s=%q on the kernel command line: want a duration above 0 and at most %v", layout.TimerSlackArg, v, maxTimerSlack)
	}
	return d, true, nil
}
