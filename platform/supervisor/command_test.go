package supervisor

import (
	"context"
	"errors"
	"log/slog"
	"os"
	"os/exec"
	"path"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"plinth.dev/plinth/internal/testutil/cgrouptest"
	"plinth.dev/plinth/platform/logtree"
)

func statusOf(s *Supervisor, dn string) Status {
	for _, st := range s.Snapshot() {
		if st.DN == dn {
			return st
		}
	}
	return Status{}
}

// TestRunCommand: a child process's output lands in the runnable's log
// (klog levels kept), a crashing process is restarted and its failures in
// a row are counted, and stopping the tree stops the process — first with
// SIGTERM, then SIGKILL for one that ignores it.
func TestRunCommand(t *testing.T) {
	dir := t.TempDir()
	pidFile := filepath.Join(dir, "pid")
	script := `echo plain line; echo 'W1130 12:00:00.000001    42 main.go:7] a warning'; echo $$ > ` + pidFile + `; ` +
		`if [ -e ` + filepath.Join(dir, "crash") + ` ]; then exit 3; fi; trap '' TERM; while :; do sleep 0.05; done`
	if err := os.WriteFile(filepath.Join(dir, "crash"), nil, 0o600); err != nil {
		t.Fatal(err)
	}
	lt := logtree.New(1000)
	ctx, cancel := context.WithCancel(context.Background())
	s := New(ctx, lt, func(ctx context.Context) error {
		if err := Run(ctx, "proc", func(ctx context.Context) error {
			return RunCommand(ctx, Command{Path: "/bin/sh", Args: []string{"-c", script}, Grace: 200 * time.Millisecond})
		}); err != nil {
			return err
		}
		Signal(ctx, SignalHealthy)
		<-ctx.Done()
		return ctx.Err()
	}, Options{InitialBackoff: 10 * time.Millisecond, MaxBackoff: 20 * time.Millisecond, ResetAfter: time.Hour})
	waitFor(t, "three failures in a row", func() bool { return statusOf(s, "root.proc").Failures >= 3 })
	os.Remove(filepath.Join(dir, "crash"))
	waitFor(t, "healthy", func() bool { return stateOf(s, "root.proc") == StateHealthy })
	var pid int
	waitFor(t, "pid file", func() bool {
		b, err := os.ReadFile(pidFile)
		pid, _ = strconv.Atoi(strings.TrimSpace(string(b)))
		return err == nil && pid > 0 && syscall.Kill(pid, 0) == nil
	})
	// Snapshot names the process (the shell's PID; the root's is ours).
	waitFor(t, "PID in the snapshot", func() bool { return statusOf(s, "root.proc").PID == pid })
	if got := statusOf(s, "root").PID; got != os.Getpid() {
		t.Errorf("root's PID %d, want %d", got, os.Getpid())
	}
	var plain, warn bool
	for _, e := range lt.Read("root.proc"+logtree.ProcessOutputSuffix, 0) {
		plain = plain || (e.Message == "plain line" && e.Level == slog.LevelInfo)
		warn = warn || (e.Message == "a warning" && e.Level == slog.LevelWarn)
	}
	if !plain || !warn {
		t.Errorf("process output in the log: plain %v, klog warning %v", plain, warn)
	}
	cancel()
	s.Wait()
	// The shell ignored SIGTERM: it must have been killed.
	waitFor(t, "process gone", func() bool { return syscall.Kill(pid, 0) != nil })
	if got := statusOf(s, "root.proc").PID; got != 0 {
		t.Errorf("PID %d in the snapshot after the process ended", got)
	}
}

// TestRunCommandExitsBeforeReady: a process that exits before its
// readiness probe ever succeeds ends RunCommand with its exit status (so
// that the supervisor restarts it); the probe stops with it.
func TestRunCommandExitsBeforeReady(t *testing.T) {
	var probes atomic.Int32
	never := func(ctx context.Context) error {
		probes.Add(1)
		return errors.New("not ready")
	}
	done := make(chan struct{})
	var errs map[string]error
	go func() {
		defer close(done)
		_, errs = runOnce(t, map[string]Command{"early": {Path: "/bin/sh", Args: []string{"-c", "sleep 0.3; exit 3"}, Ready: never}})
	}()
	select {
	case <-done:
	case <-time.After(30 * time.Second):
		t.Fatal("RunCommand still waits for the readiness of a process that exited")
	}
	var ee *exec.ExitError
	if err := errs["early"]; !errors.As(err, &ee) || ee.ExitCode() != 3 {
		t.Errorf("RunCommand = %v, want the exit status 3", err)
	}
	after := probes.Load()
	time.Sleep(600 * time.Millisecond)
	if probes.Load() != after || after == 0 {
		t.Errorf("probes: %d when RunCommand returned, %d later (want some, and no more)", after, probes.Load())
	}
}

// runOnce runs each command once, as a child runnable of root named by
// its key, and returns the log tree and each command's error.
func runOnce(t *testing.T, cmds map[string]Command) (*logtree.Tree, map[string]error) {
	t.Helper()
	lt := logtree.New(1000)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	type result struct {
		name string
		err  error
	}
	done := make(chan result, len(cmds))
	s := New(ctx, lt, func(ctx context.Context) error {
		for name, cmd := range cmds {
			if err := Run(ctx, name, func(ctx context.Context) error {
				err := RunCommand(ctx, cmd)
				done <- result{name, err}
				Signal(ctx, SignalDone)
				return err
			}); err != nil {
				return err
			}
		}
		Signal(ctx, SignalHealthy)
		<-ctx.Done()
		return ctx.Err()
	}, Options{})
	errs := map[string]error{}
	for range cmds {
		r := <-done
		errs[r.name] = r.err
	}
	cancel()
	s.Wait()
	return lt, errs
}

// TestRunCommandUserAndStdoutStream: a process runs as the user it is
// given, and its standard output can go to a stream of its own (the API
// server's audit log) while its standard error stays in the runnable's
// process output.
func TestRunCommandUserAndStdoutStream(t *testing.T) {
	if os.Getuid() != 0 {
		t.Fatal("needs root (make unit runs as root) to start a process as another user")
	}
	lt, errs := runOnce(t, map[string]Command{"proc": {Path: "/bin/sh", Args: []string{"-c", `echo uid=$(id -u) gid=$(id -g); echo to-stderr >&2`},
		User: &syscall.Credential{Uid: 10001, Gid: 10001, Groups: []uint32{}}, Stdout: "audit", StdoutEntries: 10}})
	if err := errs["proc"]; err != nil {
		t.Fatal(err)
	}
	out, audit := lt.Read("root.proc"+logtree.ProcessOutputSuffix, 0), lt.Read("root.proc.audit", 0)
	if len(audit) != 1 || audit[0].Message != "uid=10001 gid=10001" {
		t.Errorf("the stdout stream: %v", audit)
	}
	if len(out) != 1 || out[0].Message != "to-stderr" {
		t.Errorf("the process output: %v", out)
	}
}

// TestRunCommandCgroup: a Command with a Cgroup starts in that cgroup
// (the process itself reads it from /proc/self/cgroup), and one naming
// a cgroup that does not exist is an error of the runnable, not a
// process started in the core's.
func TestRunCommandCgroup(t *testing.T) {
	if os.Getuid() != 0 {
		t.Fatal("needs root (make unit runs as root) to make a cgroup")
	}
	_, dir, err := cgrouptest.Child(t, "plinth-supervisor")
	if err != nil {
		t.Fatalf("a cgroup for the process: %v", err)
	}
	want, err := cgrouptest.Of("self")
	if err != nil {
		t.Fatal(err)
	}
	want = path.Join(want, filepath.Base(dir))
	cat := func(cg string) Command {
		return Command{Path: "/bin/cat", Args: []string{"/proc/self/cgroup"}, Cgroup: cg}
	}
	lt, errs := runOnce(t, map[string]Command{"in": cat(dir), "missing": cat(filepath.Join(dir, "missing"))})
	if err := errs["in"]; err != nil {
		t.Errorf("in an existing cgroup: %v", err)
	}
	if err := errs["missing"]; err == nil || !strings.Contains(err.Error(), "its cgroup") {
		t.Errorf("a missing cgroup: %v", err)
	}
	// (A host may mount cgroup v1 hierarchies beside v2: only v2's
	// line, 0::, is the one the Command chose.)
	got := ""
	for _, e := range lt.Read("root.in"+logtree.ProcessOutputSuffix, 0) {
		if v2, ok := strings.CutPrefix(e.Message, "0::"); ok {
			got = v2
		}
	}
	if got != want {
		t.Errorf("the process's cgroup (v2): %q, want %q", got, want)
	}
}

// TestChildPriority: a child starts at the default priority (nice 0)
// though every thread of its parent runs above it, as the core's do
// (reaper.CoreNice).
func TestChildPriority(t *testing.T) {
	if os.Getuid() != 0 {
		t.Fatal("needs root (make unit runs as root) to raise a priority")
	}
	renice := func(nice int) {
		tasks, err := os.ReadDir("/proc/self/task")
		if err != nil {
			t.Fatal(err)
		}
		for _, task := range tasks {
			tid, _ := strconv.Atoi(task.Name())
			_ = unix.Setpriority(unix.PRIO_PROCESS, tid, nice)
		}
	}
	renice(-5)
	t.Cleanup(func() { renice(0) })
	lt, errs := runOnce(t, map[string]Command{"nice": {Path: "/bin/sh", Args: []string{"-c", `cut -d" " -f19 /proc/self/stat`}}})
	if err := errs["nice"]; err != nil {
		t.Fatal(err)
	}
	if out := lt.Read("root.nice"+logtree.ProcessOutputSuffix, 0); len(out) != 1 || out[0].Message != "0" {
		t.Errorf("the child's nice value: %v, want 0", out)
	}
}

// TestChildOutlivesItsStartersThread: a child started with Pdeathsig
// from a goroutine that then exits locked to its OS thread (the runtime
// ends that thread) keeps running: startChild forks from a thread that
// never ends. Forked from the goroutine's own thread, it would get
// SIGKILL as the thread ends.
func TestChildOutlivesItsStartersThread(t *testing.T) {
	cmd := exec.Command("/bin/sleep", "30")
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	// The runtime ends a locked goroutine's thread, except the main
	// thread, which it only parks: a goroutine that lands there keeps it
	// until the test ends, and the next one gets another thread.
	release := make(chan struct{})
	defer close(release)
	for started := false; !started; {
		errc := make(chan error, 1)
		go func() {
			runtime.LockOSThread() // never unlocked: the thread ends with this goroutine
			if syscall.Gettid() == syscall.Getpid() {
				errc <- errMainThread
				<-release
				return
			}
			errc <- startChild(cmd)
		}()
		switch err := <-errc; err {
		case nil:
			started = true
		case errMainThread:
		default:
			t.Fatal(err)
		}
	}
	defer cmd.Process.Kill()
	deadline := time.Now().Add(time.Second)
	for time.Now().Before(deadline) {
		var ws syscall.WaitStatus
		if pid, err := syscall.Wait4(cmd.Process.Pid, &ws, syscall.WNOHANG, nil); pid != 0 || err != nil {
			t.Fatalf("the child ended with the thread of the goroutine that started it: %v (signal %v), %v", ws, ws.Signal(), err)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

var errMainThread = errors.New("on the main thread")
