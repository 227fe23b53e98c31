// Package reaper is the whole life of PID 1.
//
// Reaping orphans with wait4(-1) in the same process that runs os/exec
// steals exit statuses from cmd.Wait. So PID 1 does nothing else: it mounts
// the pseudo filesystems, starts the real init (the "core") as its only
// child, reaps every process that gets reparented to it, forwards
// shutdown signals to the core and, when the core exits, kills what is
// left, syncs and powers off or reboots as the core asked.
//
//	kernel ──► PID 1 (reaper) ──fork/exec──► core (everything else)
//	             ▲  │ SIGINT (Ctrl-Alt-Del), SIGTERM, SIGPWR ──► forwarded
//	             └──┴ core exit code ──► power off / reboot / halt
package reaper

import (
	"fmt"
	"io"
	"os"
	"os/signal"
	"runtime"
	"strings"
	"time"

	"golang.org/x/sys/unix"

	"plinth.dev/plinth/platform/mount"
)

// Exit codes of the core: what PID 1 does when the core exits.
const (
	ExitPowerOff = 0
	ExitReboot   = 10
	// Any other exit (or a crash) reboots after a sync.
)

// EarlyMounts are mounted by PID 1 before the core starts.
var EarlyMounts = []mount.Mount{
	{Source: "proc", Target: "/proc", FSType: "proc", Flags: unix.MS_NOSUID | unix.MS_NODEV | unix.MS_NOEXEC},
	{Source: "sysfs", Target: "/sys", FSType: "sysfs", Flags: unix.MS_NOSUID | unix.MS_NODEV | unix.MS_NOEXEC},
	{Source: "devtmpfs", Target: "/dev", FSType: "devtmpfs", Flags: unix.MS_NOSUID, Data: "mode=0755"},
}

// CoreNice is the core's scheduling priority (nice value), above
// everything it starts (they run at 0, supervisor's spawner thread). The
// core is etcd, the curator, the API proxy and the log collector: little
// CPU, but every API request of the node waits for it. Starved by the
// API server and the pods it answered late, and a kubelet's pod status
// reached the API server half a minute after it changed. etcd's own
// tuning guide asks for the same. Guarded by TestCorePriority.
const CoreNice = -10

// startCore starts the core at CoreNice: forked from a thread of that
// priority (Linux keeps it per thread, and a child inherits its
// parent thread's), so that every thread of the core has it from the
// start. A priority that cannot be set is reported (prioErr) and the
// core starts at the default: a slower node, not one that cannot boot.
func startCore(core string, args, env []string) (proc *os.Process, prioErr, err error) {
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	tid := unix.Gettid()
	if prioErr = unix.Setpriority(unix.PRIO_PROCESS, tid, CoreNice); prioErr == nil {
		defer unix.Setpriority(unix.PRIO_PROCESS, tid, 0)
	}
	proc, err = os.StartProcess(core, args, &os.ProcAttr{
		Env:   dedupEnv(env),
		Files: []*os.File{os.Stdin, os.Stdout, os.Stderr},
	})
	return proc, prioErr, err
}

// Run never returns. core is started with args and env; console receives
// PID 1's own messages.
func Run(console io.Writer, logLine func(msg string) string, core string, args, env []string) {
	say := func(format string, a ...any) { fmt.Fprintln(console, logLine(fmt.Sprintf(format, a...))) }
	if err := mount.All(EarlyMounts); err != nil {
		say("early mounts: %v", err)
	}
	// Ctrl-Alt-Del becomes SIGINT to us instead of an immediate reboot.
	if err := unix.Reboot(unix.LINUX_REBOOT_CMD_CAD_OFF); err != nil {
		say("disabling Ctrl-Alt-Del reboot: %v", err)
	}
	sigs := make(chan os.Signal, 16)
	signal.Notify(sigs, unix.SIGCHLD, unix.SIGINT, unix.SIGTERM, unix.SIGPWR)

	proc, prioErr, err := startCore(core, args, env)
	if prioErr != nil {
		say("core priority %d not set (%v): it runs at the default", CoreNice, prioErr)
	}
	if err != nil {
		say("cannot start core %s: %v; rebooting in 5s", core, err)
		time.Sleep(5 * time.Second)
		finish(say, unix.LINUX_REBOOT_CMD_RESTART)
	}
	corePID := proc.Pid

	for sig := range sigs {
		switch sig {
		case unix.SIGCHLD:
			status, exited := reap(corePID)
			if !exited {
				continue
			}
			switch {
			case status.Exited() && status.ExitStatus() == ExitPowerOff:
				say("core finished, powering off")
				finish(say, unix.LINUX_REBOOT_CMD_POWER_OFF)
			case status.Exited() && status.ExitStatus() == ExitReboot:
				say("core finished, rebooting")
				finish(say, unix.LINUX_REBOOT_CMD_RESTART)
			default:
				say("core died (%s), syncing and rebooting", describe(status))
				finish(say, unix.LINUX_REBOOT_CMD_RESTART)
			}
		default:
			// The core decides what each request means and shuts down cleanly.
			_ = unix.Kill(corePID, sig.(unix.Signal))
		}
	}
}

// dedupEnv keeps the last value of each variable, as os/exec does;
// os.StartProcess passes duplicates on and the child would see the first.
func dedupEnv(env []string) []string {
	last := map[string]int{}
	for i, kv := range env {
		k, _, _ := strings.Cut(kv, "=")
		last[k] = i
	}
	var out []string
	for i, kv := range env {
		k, _, _ := strings.Cut(kv, "=")
		if last[k] == i {
			out = append(out, kv)
		}
	}
	return out
}

// reap collects every exited child; it reports the core's status once the
// core is among them.
func reap(corePID int) (unix.WaitStatus, bool) {
	var coreStatus unix.WaitStatus
	coreExited := false
	for {
		var ws unix.WaitStatus
		pid, err := unix.Wait4(-1, &ws, unix.WNOHANG, nil)
		if err == unix.EINTR {
			continue
		}
		if pid <= 0 || err != nil {
			return coreStatus, coreExited
		}
		if pid == corePID {
			coreStatus, coreExited = ws, true
		}
	}
}

func describe(ws unix.WaitStatus) string {
	if ws.Signaled() {
		return "killed by " + ws.Signal().String()
	}
	return fmt.Sprintf("exit status %d", ws.ExitStatus())
}

// finish ends every remaining process, syncs and executes cmd.
func finish(say func(string, ...any), cmd int) {
	_ = unix.Kill(-1, unix.SIGTERM)
	deadline := time.Now().Add(3 * time.Second)
	for time.Now().Before(deadline) {
		reap(-1)
		if _, err := unix.Wait4(-1, nil, unix.WNOHANG, nil); err == unix.ECHILD {
			break
		}
		time.Sleep(50 * time.Millisecond)
	}
	_ = unix.Kill(-1, unix.SIGKILL)
	reap(-1)
	unix.Sync()
	if err := unix.Reboot(cmd); err != nil {
		say("reboot(%#x): %v", cmd, err)
	}
	select {}
}
