package supervisor

import (
	"os"
	"testing"
)

func TestProcessUsage(t *testing.T) {
	// Burn a little CPU and memory so both are visibly non-zero.
	buf := make([]byte, 64<<20)
	for i := range buf {
		buf[i] = byte(i)
	}
	u, err := ProcessUsage(os.Getpid())
	if err != nil {
		t.Fatal(err)
	}
	if u.CPUSeconds <= 0 || u.RSSBytes < 32<<20 || u.PeakRSSBytes < u.RSSBytes {
		t.Errorf("usage of this test: %+v", u)
	}
	if _, err := ProcessUsage(1 << 30); err == nil {
		t.Error("usage of a process that does not exist: no error")
	}
	_ = buf[len(buf)-1]
}
