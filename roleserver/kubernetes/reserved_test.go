package kubernetes

import (
	"os"
	"path/filepath"
	"testing"
)

// TestReserve: the node OS's share on the sliding scale, the control
// plane's on a controller, and pods keep a quarter of the smallest node.
func TestReserve(t *testing.T) {
	for _, c := range []struct {
		totalMiB     int64
		controlPlane bool
		want         reservation
	}{
		{2048, false, reservation{512, 100}},
		{2048, true, reservation{512 + 768, 300}},
		{4096, true, reservation{1024 + 768, 300}},
		// 25 % of 4 GiB, 20 % of 4, 10 % of 8, 6 % of 16.
		{32 << 10, false, reservation{1024 + 819 + 819 + 983, 100}},
		// The floor, then the cap: 256 MiB of 512; 768+256 capped at 3/4 of 1 GiB.
		{512, false, reservation{256, 100}},
		{1024, true, reservation{768, 300}},
	} {
		if got := reserve(c.totalMiB, c.controlPlane); got != c.want {
			t.Errorf("reserve(%d MiB, control plane %v) = %+v, want %+v", c.totalMiB, c.controlPlane, got, c.want)
		}
	}
	if got := (reservation{1280, 300}).kubeletReserved(); got["memory"] != "1280Mi" || got["cpu"] != "300m" {
		t.Errorf("kubeletReserved = %v", got)
	}
}

// TestMemTotal reads /proc/meminfo's MemTotal and refuses what is not one.
func TestMemTotal(t *testing.T) {
	dir := t.TempDir()
	write := func(text string) string {
		p := filepath.Join(dir, "meminfo")
		if err := os.WriteFile(p, []byte(text), 0o600); err != nil {
			t.Fatal(err)
		}
		return p
	}
	if got, err := memTotalMiB(write("MemTotal:        2030992 kB\nMemFree:          118840 kB\n")); err != nil || got != 1983 {
		t.Errorf("memTotalMiB = %d, %v; want 1983", got, err)
	}
	for _, bad := range []string{"MemFree: 1 kB\n", "MemTotal: x kB\n", "MemTotal: 12 MB\n", ""} {
		if got, err := memTotalMiB(write(bad)); err == nil {
			t.Errorf("memTotalMiB(%q) = %d, want an error", bad, got)
		}
	}
	if _, err := memTotalMiB(filepath.Join(dir, "missing")); err == nil {
		t.Error("a missing meminfo is no error")
	}
	if got, err := memTotalMiB("/proc/meminfo"); err != nil || got <= 0 {
		t.Errorf("this machine's MemTotal: %d, %v", got, err)
	}
}
