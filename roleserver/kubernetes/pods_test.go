package kubernetes

import (
	"os"
	"os/exec"
	"path/filepath"
	"syscall"
	"testing"
	"time"
)

// TestStopPods: processes running the shim binary are killed, others
// are not; a missing pod cgroup is no error.
func TestStopPods(t *testing.T) {
	dir := t.TempDir()
	sleep, err := exec.LookPath("sleep")
	if err != nil {
		t.Fatal(err)
	}
	shim := filepath.Join(dir, "shim")
	b, err := os.ReadFile(sleep)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(shim, b, 0o755); err != nil {
		t.Fatal(err)
	}
	s := exec.Command(shim, "60")
	other := exec.Command(sleep, "60")
	for _, c := range []*exec.Cmd{s, other} {
		if err := c.Start(); err != nil {
			t.Fatal(err)
		}
		defer c.Process.Kill()
	}
	n, err := stopPods(filepath.Join(dir, "no-cgroup"), "/proc", shim)
	if err != nil || n != 1 {
		t.Fatalf("stopPods: %d killed, %v; want 1, nil", n, err)
	}
	if err := s.Wait(); err == nil || s.ProcessState.Sys().(syscall.WaitStatus).Signal() != syscall.SIGKILL {
		t.Errorf("the shim: %v, want killed", err)
	}
	time.Sleep(50 * time.Millisecond)
	if err := other.Process.Signal(syscall.Signal(0)); err != nil {
		t.Errorf("another process was killed: %v", err)
	}
}
