//go:build built

package launch

import (
	"math"
	"runtime"
	"testing"
)

// TestQEMUTSCArgs: under TCG a kernel booted directly is told the TSC
// rate (tsc_early_khz) after its image's command line; one booted by the
// firmware, or under KVM (no rate), keeps its own.
func TestQEMUTSCArgs(t *testing.T) {
	appendArg := func(o NodeOptions, kvm bool, khz uint64) string {
		args := qemuArgs(o, "/s/qmp", "", kvm, khz)
		for i := 0; i+1 < len(args); i++ {
			if args[i] == "-append" {
				return args[i+1]
			}
		}
		return "(none)"
	}
	direct := NodeOptions{Kernel: "/i/vmlinuz", Cmdline: "console=ttyS0 tsc=reliable"}
	for _, c := range []struct {
		name string
		o    NodeOptions
		kvm  bool
		khz  uint64
		want string
	}{
		{"TCG, direct", direct, false, 2596126, "console=ttyS0 tsc=reliable tsc_early_khz=2596126"},
		{"KVM, direct", direct, true, 0, "console=ttyS0 tsc=reliable"},
		{"TCG, firmware", NodeOptions{DiskPath: "/d/disk.img", UEFI: &UEFI{Vars: "/d/vars.fd"}}, false, 2596126, "(none)"},
	} {
		if got := appendArg(c.o, c.kvm, c.khz); got != c.want {
			t.Errorf("%s: -append %q, want %q", c.name, got, c.want)
		}
	}
}

// TestHostTSC: the host's TSC rate, measured twice, agrees with itself
// to 0.2 % (a guest clock off by that much drifts seven seconds an
// hour), and is a plausible rate.
func TestHostTSC(t *testing.T) {
	if runtime.GOARCH != "amd64" {
		t.Skip("only an amd64 host's TSC is a TCG guest's")
	}
	a, b := measureTSCkHz(), measureTSCkHz()
	if a < 100_000 || a > 10_000_000 {
		t.Fatalf("TSC rate %d kHz: not between 100 MHz and 10 GHz", a)
	}
	if d := math.Abs(float64(a)-float64(b)) / float64(a); d > 0.002 {
		t.Errorf("TSC rate measured %d and %d kHz: %.2f %% apart", a, b, 100*d)
	}
	t.Logf("host TSC: %d kHz", a)
}
