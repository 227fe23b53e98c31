package main

import (
	"strings"
	"testing"
	"time"

	"plinth.dev/plinth/board"
	"plinth.dev/plinth/platform/layout"
)

// TestTimerSlack: the argument's absence keeps the kernel's default, a
// duration within bounds is taken, anything else is an error naming the
// argument (the step fails before the data disk is touched); the QEMU
// board's command line names one init accepts.
func TestTimerSlack(t *testing.T) {
	if _, ok, err := timerSlack(map[string]string{}); ok || err != nil {
		t.Errorf("no argument: ok %v, err %v; want the default", ok, err)
	}
	for v, want := range map[string]time.Duration{"4ms": 4 * time.Millisecond, "50us": 50 * time.Microsecond, "100ms": 100 * time.Millisecond} {
		if d, ok, err := timerSlack(map[string]string{layout.TimerSlackArg: v}); !ok || err != nil || d != want {
			t.Errorf("%s: %v, %v, %v; want %v", v, d, ok, err, want)
		}
	}
	for _, v := range []string{"", "4", "4 ms", "-1ms", "0s", "101ms", "1h"} {
		if _, _, err := timerSlack(map[string]string{layout.TimerSlackArg: v}); err == nil || !strings.Contains(err.Error(), layout.TimerSlackArg) {
			t.Errorf("%q: err %v, want one naming %s", v, err, layout.TimerSlackArg)
		}
	}
	b, err := board.Get("qemu-x86_64")
	if err != nil {
		t.Fatal(err)
	}
	args := map[string]string{}
	for _, a := range b.KernelCmdline() {
		k, v, _ := strings.Cut(a, "=")
		args[k] = v
	}
	if d, ok, err := timerSlack(args); !ok || err != nil || d != 10*time.Millisecond {
		t.Errorf("the QEMU board's command line %q: slack %v, %v, %v; want 10ms", b.KernelCmdline(), d, ok, err)
	}
}
