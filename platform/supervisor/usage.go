package supervisor

import (
	"bufio"
	"bytes"
	"fmt"
	"os"
	"strconv"
	"strings"
)

// Usage is what a process has used so far.
type Usage struct {
	// CPUSeconds is its user and system CPU time.
	CPUSeconds float64
	// RSSBytes is its resident memory now, PeakRSSBytes the most it had
	// (VmHWM).
	RSSBytes, PeakRSSBytes uint64
}

// clockTicks is USER_HZ, the unit of /proc/PID/stat's times: 100 on
// every Linux architecture Plinth runs on.
const clockTicks = 100

// ProcessUsage reads pid's usage from /proc.
func ProcessUsage(pid int) (Usage, error) {
	var u Usage
	stat, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return u, err
	}
	// The command name (field 2) may hold spaces and parentheses: the
	// fields after it start after the last ')'.
	i := bytes.LastIndexByte(stat, ')')
	if i < 0 {
		return u, fmt.Errorf("/proc/%d/stat: no command name", pid)
	}
	f := strings.Fields(string(stat[i+1:]))
	// f[0] is field 3 (state); utime and stime are fields 14 and 15.
	if len(f) < 13 {
		return u, fmt.Errorf("/proc/%d/stat: %d fields", pid, len(f)+2)
	}
	utime, err1 := strconv.ParseUint(f[11], 10, 64)
	stime, err2 := strconv.ParseUint(f[12], 10, 64)
	if err1 != nil || err2 != nil {
		return u, fmt.Errorf("/proc/%d/stat: bad CPU times %q %q", pid, f[11], f[12])
	}
	u.CPUSeconds = float64(utime+stime) / clockTicks
	status, err := os.Open(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		return u, err
	}
	defer status.Close()
	sc := bufio.NewScanner(status)
	for sc.Scan() {
		k, v, ok := strings.Cut(sc.Text(), ":")
		if !ok {
			continue
		}
		var into *uint64
		switch k {
		case "VmRSS":
			into = &u.RSSBytes
		case "VmHWM":
			into = &u.PeakRSSBytes
		default:
			continue
		}
		kb, err := strconv.ParseUint(strings.TrimSuffix(strings.TrimSpace(v), " kB"), 10, 64)
		if err != nil {
			return u, fmt.Errorf("/proc/%d/status %s: %w", pid, k, err)
		}
		*into = kb << 10
	}
	return u, sc.Err()
}
