package supervisor

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/exec"
	"regexp"
	"runtime"
	"strings"
	"sync"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	"plinth.dev/plinth/platform/logtree"
)

// Child processes. Kubernetes components, containerd and the like are
// separate programs; RunCommand makes one of them behave like any other
// runnable: its output goes into the runnable's logger line by line (klog
// lines keep their level), it dies with its runnable (SIGTERM, then
// SIGKILL after a grace period; and SIGKILL if the core itself dies), and
// its exit is the runnable's error, so the supervisor restarts it with
// backoff and counts the crashes.

// Command is a child process for RunCommand.
type Command struct {
	Path string
	Args []string // without the program name
	Env  []string // nil: the core's environment
	Dir  string
	// Grace is how long a process gets between SIGTERM and SIGKILL when
	// its runnable stops (default 10 s).
	Grace time.Duration
	// Stdout, if set, names a stream (logtree.Tree.Stream) below the
	// runnable's DN that the process's standard output goes to, a line
	// per entry as it is, kept in a ring of StdoutEntries entries of its
	// own, off the console: for a voluminous machine-read log such as the
	// API server's audit events. Its standard error stays below
	// ProcessOutputSuffix.
	Stdout        string
	StdoutEntries int
	// StdoutAlso, if set with Stdout, gets a copy of the standard output
	// (the audit events' store on the data volume). Its Write must not
	// fail or block for long: the process writes through it.
	StdoutAlso io.Writer
	// User, if set, is the user and groups the process runs as (an
	// unprivileged user of its own: nil runs it as the core's, root).
	User *syscall.Credential
	// Cgroup, if set, is the cgroup v2 directory the process starts in
	// (clone3 into it: the process and everything it starts are in it
	// from their first instruction); empty: the core's.
	Cgroup string
	// Ready, if set, is polled (every 250 ms) after the start; the
	// runnable signals healthy once it returns nil. Without it the
	// runnable is healthy as soon as the process started.
	Ready func(ctx context.Context) error
}

// RunCommand runs c as the calling runnable's child process until it
// exits or ctx ends, and returns its exit as an error (nil only if it
// exited 0 by itself).
func RunCommand(ctx context.Context, c Command) error {
	o := c
	if o.Grace <= 0 {
		o.Grace = 10 * time.Second
	}
	log := Logger(ctx)
	pr, pw := io.Pipe()
	cmd := exec.CommandContext(ctx, c.Path, c.Args...)
	cmd.Env, cmd.Dir = c.Env, c.Dir
	cmd.Stdout, cmd.Stderr = pw, pw
	if c.Stdout != "" {
		cmd.Stdout = streamWriter(ctx, c.Stdout, c.StdoutEntries)
		if c.StdoutAlso != nil {
			cmd.Stdout = io.MultiWriter(c.StdoutAlso, cmd.Stdout)
		}
	}
	// Own process group, so the whole tree can be signalled; and killed
	// if the core dies without stopping it.
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL, Credential: c.User}
	if c.Cgroup != "" {
		dir, err := os.Open(c.Cgroup)
		if err != nil {
			return fmt.Errorf("starting %s: its cgroup: %w", c.Path, err)
		}
		defer dir.Close()
		cmd.SysProcAttr.UseCgroupFD, cmd.SysProcAttr.CgroupFD = true, int(dir.Fd())
	}
	// ctx's end sends SIGTERM; exec kills after the grace period.
	cmd.Cancel = func() error { return cmd.Process.Signal(syscall.SIGTERM) }
	cmd.WaitDelay = o.Grace

	var lines sync.WaitGroup
	lines.Add(1)
	go func() {
		defer lines.Done()
		logLines(outputLogger(ctx), pr)
	}()
	if err := startChild(cmd); err != nil {
		pw.Close()
		lines.Wait()
		return fmt.Errorf("starting %s: %w", c.Path, err)
	}
	log.Info("started "+cmd.Path, "pid", cmd.Process.Pid)
	setPID(ctx, cmd.Process.Pid)
	defer setPID(ctx, 0)
	// The readiness probe ends with the process: one that exits before
	// it is ready (the API server's fatal post-start hook under load)
	// must be restarted, not waited for. Guarded by
	// TestRunCommandExitsBeforeReady.
	probeCtx, endProbe := context.WithCancel(ctx)
	defer endProbe()
	ready := make(chan struct{})
	go func() {
		defer close(ready)
		if o.Ready == nil {
			Signal(ctx, SignalHealthy)
			return
		}
		t := time.NewTicker(250 * time.Millisecond)
		defer t.Stop()
		for {
			if err := o.Ready(probeCtx); err == nil && probeCtx.Err() == nil {
				Signal(ctx, SignalHealthy)
				return
			}
			select {
			case <-probeCtx.Done():
				return
			case <-t.C:
			}
		}
	}()
	err := cmd.Wait()
	endProbe()
	// Kill what is left of the process group (e.g. a shim it spawned
	// without its own group keeps running on purpose only if it moved
	// itself out of this group).
	_ = syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL)
	pw.Close()
	lines.Wait()
	<-ready
	if ctx.Err() != nil {
		return ctx.Err()
	}
	if err != nil {
		return fmt.Errorf("%s: %w", cmd.Path, err)
	}
	return nil
}

// streamWriter is the writer of stream name below the runnable's DN,
// registered with its own ring of entries (io.Discard outside a
// supervisor).
func streamWriter(ctx context.Context, name string, entries int) io.Writer {
	n, ok := ctx.Value(ctxKey{}).(*node)
	if !ok {
		return io.Discard
	}
	dn := n.dn + "." + name
	n.s.lt.Stream(dn, entries)
	return n.s.lt.Writer(dn, slog.LevelInfo)
}

// outputLogger is where a runnable's child process's output goes: below
// the runnable's DN (logtree.ProcessOutputSuffix), so that a console can
// keep it apart from the node's own lines.
func outputLogger(ctx context.Context) *slog.Logger {
	if n, ok := ctx.Value(ctxKey{}).(*node); ok {
		return n.s.lt.Logger(n.dn + logtree.ProcessOutputSuffix)
	}
	return slog.Default()
}

// klogLine is a klog header: "I1130 12:34:56.789012    1234 file.go:123] msg".
var klogLine = regexp.MustCompile(`^([IWEF])\d{4} \d\d:\d\d:\d\d\.\d+\s+\d+ ([^\]]+)\] (.*)$`)

// logLines copies a process's output into log, one entry per line, with
// klog's level where the line has one.
func logLines(log *slog.Logger, r io.Reader) {
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	for sc.Scan() {
		line := strings.TrimRight(sc.Text(), "\r")
		if line == "" {
			continue
		}
		level, msg, src := slog.LevelInfo, line, ""
		if m := klogLine.FindStringSubmatch(line); m != nil {
			switch m[1] {
			case "W":
				level = slog.LevelWarn
			case "E", "F":
				level = slog.LevelError
			}
			src, msg = m[2], m[3]
		}
		if src != "" {
			log.Log(context.Background(), level, msg, "src", src)
		} else {
			log.Log(context.Background(), level, msg)
		}
	}
	// A line longer than the buffer ends the scan: drain the rest so the
	// process never blocks on a full pipe.
	if err := sc.Err(); err != nil && !errors.Is(err, io.ErrClosedPipe) {
		log.Warn("process output", "err", err)
		_, _ = io.Copy(io.Discard, r)
	}
}

// setPID records the calling runnable's child process for Snapshot.
func setPID(ctx context.Context, pid int) {
	if n, ok := ctx.Value(ctxKey{}).(*node); ok {
		n.s.mu.Lock()
		n.pid = pid
		n.s.mu.Unlock()
	}
}

// startChild starts cmd from spawnerThread. A child's Pdeathsig follows
// the OS thread that forked it, not the process: the runtime ends the
// thread of a goroutine that exits locked to it (runtime.LockOSThread, as
// sysimage.Verify's paced reader does), and any child that thread had
// forked for another goroutine would get SIGKILL with it. Guarded by
// TestChildOutlivesItsStartersThread.
func startChild(cmd *exec.Cmd) error {
	errc := make(chan error, 1)
	spawnerThread() <- func() {
		// A child inherits its parent thread's nice value: the core runs
		// above the default (reaper.CoreNice), its children at it.
		// Guarded by TestChildPriority.
		if err := unix.Setpriority(unix.PRIO_PROCESS, unix.Gettid(), 0); err != nil {
			errc <- fmt.Errorf("the default priority for children: %w", err)
			return
		}
		errc <- cmd.Start()
	}
	return <-errc
}

// spawnerThread is a goroutine locked to its OS thread for good, which
// runs the functions sent to it: every child is forked from this one
// thread, which ends with the core only.
var spawnerThread = sync.OnceValue(func() chan<- func() {
	c := make(chan func())
	go func() {
		runtime.LockOSThread()
		for f := range c {
			f()
		}
	}()
	return c
})
