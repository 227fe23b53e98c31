package launch

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"time"

	"plinth.dev/plinth/platform/supervisor"
)

// A silent start is a QEMU that runs but whose guest prints nothing at all.
// Every guest the harness boots speaks within seconds of QEMU's start:
// OVMF's boot manager lines, or the kernel's first warnings (2.4 s guest
// uptime for the Plinth image, before /init runs) — under TCG on a
// starved machine, well under a minute. CI once saw a TestCluster node
// whose console stayed empty for the test's whole 25 minutes while QEMU
// ran; that one hang, not the product, sank the run. A start that silent
// has run none of the image's code (no firmware or kernel line means no
// /init), so its disks and TPM are as they were: Launch writes down what
// QEMU was doing, kills it and starts it once more.
//
//	Launch ──► QEMU ──► first console byte? ──yes──► return the node
//	                         │ no, within SilentStart (default 3 min)
//	                         ▼
//	             silent-start-N.txt: QEMU's CPU time, its threads'
//	             states and wait channels, QMP query-status and the
//	             vCPUs' registers, swtpm alive?, its log tail
//	                         │
//	             kill, keep qemu.log/swtpm.log as *.silent-start-N.log,
//	             launch again (once); silent again: ErrSilentStart

// DefaultSilentStart is how long a guest may print nothing after QEMU
// starts before Launch counts the start as hung.
const DefaultSilentStart = 3 * time.Minute

// SilentStartTries is how many launches Launch makes before it gives up on
// a node whose guest prints nothing.
const SilentStartTries = 2

// ErrSilentStart is wrapped by Launch when every try printed nothing.
var ErrSilentStart = errors.New("guest printed nothing")

// silentStartLimit is o.SilentStart with its default; 0 means no limit.
func (o NodeOptions) silentStartLimit() time.Duration {
	switch {
	case o.SilentStart < 0:
		return 0
	case o.SilentStart == 0:
		return DefaultSilentStart
	}
	return o.SilentStart
}

// awaitFirstOutput waits until the guest prints its first byte or QEMU
// exits (both: not silent) or limit passes (silent).
func (n *Node) awaitFirstOutput(ctx context.Context, limit time.Duration) (silent bool, err error) {
	if limit <= 0 {
		return false, nil
	}
	t := time.NewTimer(limit)
	defer t.Stop()
	select {
	case <-n.spoke:
		return false, nil
	case <-n.exited:
		return false, nil
	case <-ctx.Done():
		return false, fmt.Errorf("launch: node %s: waiting for its first console output: %w", n.opts.Name, ctx.Err())
	case <-t.C:
		return true, nil
	}
}

// silentStartReport says what a running QEMU whose guest printed nothing
// was doing: whether it burnt CPU (a guest spinning) or slept (QEMU
// blocked, e.g. on its TPM socket), where each thread waited in the host
// kernel, what QMP says of the machine and where its vCPUs were.
func (n *Node) silentStartReport(ctx context.Context, after time.Duration) string {
	var b strings.Builder
	pid := n.cmd.Process.Pid
	fmt.Fprintf(&b, "node %s: the guest printed nothing in %s; qemu pid %d\n", n.opts.Name, after, pid)
	if u, err := supervisor.ProcessUsage(pid); err != nil {
		fmt.Fprintf(&b, "qemu CPU time: %v\n", err)
	} else {
		fmt.Fprintf(&b, "qemu CPU time: %.1f s in %s\n", u.CPUSeconds, after)
	}
	b.WriteString(threadStates(pid))
	qctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	if ret, err := n.QMP(qctx, "query-status", nil); err != nil {
		fmt.Fprintf(&b, "QMP query-status: %v (a QEMU whose main loop is blocked does not answer)\n", err)
	} else {
		fmt.Fprintf(&b, "QMP query-status: %s\n", ret)
		if ret, err := n.QMP(qctx, "human-monitor-command", map[string]string{"command-line": "info registers -a"}); err != nil {
			fmt.Fprintf(&b, "info registers: %v\n", err)
		} else {
			fmt.Fprintf(&b, "info registers -a:\n%s\n", hmpText(ret))
		}
	}
	if n.tpm != nil {
		select {
		case <-n.tpm.done:
			fmt.Fprintf(&b, "swtpm: exited (%s)\n", n.tpm.cmd.ProcessState)
		default:
			fmt.Fprintf(&b, "swtpm: running, pid %d\n%s", n.tpm.cmd.Process.Pid, threadStates(n.tpm.cmd.Process.Pid))
		}
		b.WriteString(strings.TrimPrefix(fileTail(n.tpm.log.Name(), 10), "; "))
		b.WriteString("\n")
	}
	return b.String()
}

// threadStates lists a process's threads with their state and the host
// kernel function each waits in.
func threadStates(pid int) string {
	dir := fmt.Sprintf("/proc/%d/task", pid)
	tids, err := os.ReadDir(dir)
	if err != nil {
		return fmt.Sprintf("threads: %v\n", err)
	}
	var b strings.Builder
	for _, tid := range tids {
		read := func(f string) string {
			s, _ := os.ReadFile(filepath.Join(dir, tid.Name(), f))
			return strings.TrimSpace(string(s))
		}
		// stat: "TID (comm) STATE ...", and comm may contain spaces.
		stat := read("stat")
		state := "?"
		if i := strings.LastIndexByte(stat, ')'); i >= 0 && len(stat) > i+2 {
			state = stat[i+2 : i+3]
		}
		fmt.Fprintf(&b, "  thread %s %-16s state %s wchan %s\n", tid.Name(), read("comm"), state, read("wchan"))
	}
	return b.String()
}

// hmpText unquotes a human-monitor-command reply (a JSON string).
func hmpText(raw []byte) string {
	var s string
	if err := json.Unmarshal(raw, &s); err != nil {
		return string(raw)
	}
	return strings.ReplaceAll(s, "\r", "")
}

// keepSilentStart writes the report and keeps the logs of a silent try
// beside the next try's, which truncates qemu.log and swtpm.log.
func keepSilentStart(dir string, try int, report string) {
	suffix := fmt.Sprintf("silent-start-%d", try)
	os.WriteFile(filepath.Join(dir, suffix+".txt"), []byte(report), 0o644)
	for _, name := range []string{"qemu", "swtpm"} {
		os.Rename(filepath.Join(dir, name+".log"), filepath.Join(dir, name+"."+suffix+".log"))
	}
}
