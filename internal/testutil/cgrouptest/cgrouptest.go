// Package cgrouptest makes cgroups (v2) for tests that start processes
// in a cgroup of their own: a child of the test process's, removed when
// the test ends. It needs root and a writable cgroup2 mount (make unit
// runs as root); Child says why it could not make one.
package cgrouptest

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// Child makes the cgroup name (made unique per process) below this
// process's and returns its directory, opened for a process to be cloned
// into (syscall.SysProcAttr.CgroupFD), and its path. It is removed at the
// test's end, which fails if a process is still in it.
func Child(t testing.TB, name string) (*os.File, string, error) {
	t.Helper()
	mounts, err := os.ReadFile("/proc/self/mountinfo")
	if err != nil {
		return nil, "", err
	}
	mount := ""
	for _, l := range strings.Split(string(mounts), "\n") {
		if f := strings.Fields(l); len(f) > 4 && strings.Contains(l, " - cgroup2 ") {
			mount = f[4]
		}
	}
	own, err := Of("self")
	if mount == "" || err != nil {
		return nil, "", errors.Join(errors.New("no cgroup2"), err)
	}
	dir := filepath.Join(mount, own, fmt.Sprintf("%s-%d", name, os.Getpid()))
	if err := os.Mkdir(dir, 0o755); err != nil {
		return nil, "", err
	}
	f, err := os.Open(dir)
	if err != nil {
		os.Remove(dir)
		return nil, "", err
	}
	t.Cleanup(func() {
		f.Close()
		if err := os.Remove(dir); err != nil {
			t.Errorf("removing the test's cgroup: %v", err)
		}
	})
	return f, dir, nil
}

// Of is the cgroup (v2, below the mount) of the process pid ("self" for
// this one), from /proc/PID/cgroup.
func Of(pid string) (string, error) {
	b, err := os.ReadFile(filepath.Join("/proc", pid, "cgroup"))
	if err != nil {
		return "", err
	}
	for _, l := range strings.Split(string(b), "\n") {
		if p, found := strings.CutPrefix(l, "0::"); found {
			return p, nil
		}
	}
	return "", fmt.Errorf("process %s: no cgroup2 entry in %q", pid, b)
}
