//go:build built

package vmtest

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"plinth.dev/plinth/image"
	"plinth.dev/plinth/launch"
)

// testKernel is $PLINTH_KERNEL or the kernel `make image` leaves in the
// default board's image. It fails rather than skips: a VM test that
// silently skips on CI would report green for a harness that was never
// exercised.
func testKernel(t *testing.T) string {
	t.Helper()
	p, err := launch.FromEnv("PLINTH_KERNEL", filepath.Join(launch.DefaultImage.Dir, image.KernelFile))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(p); err != nil {
		t.Fatalf("no kernel for VM tests (%v): run `make image`, or set PLINTH_KERNEL to a bzImage", err)
	}
	return p
}

// bareInitramfs builds bareinit and packs it, as the bench does.
func bareInitramfs(t *testing.T) string {
	t.Helper()
	dir := t.TempDir()
	bin := filepath.Join(dir, "init")
	cmd := exec.Command("go", "build", "-trimpath", "-ldflags=-s -w", "-o", bin, "../launch/bareinit")
	cmd.Env = append(os.Environ(), "CGO_ENABLED=0")
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("building bareinit: %v\n%s", err, out)
	}
	out := filepath.Join(dir, "initramfs.cpio.gz")
	if err := launch.BuildBareInitramfs(bin, out); err != nil {
		t.Fatal(err)
	}
	return out
}

// swtpmsUsing lists swtpm processes whose command line names stateDir, so
// the leftover check does not depend on pids we could have reaped already.
func swtpmsUsing(stateDir string) []string {
	var found []string
	procs, _ := filepath.Glob("/proc/[0-9]*/cmdline")
	for _, p := range procs {
		b, err := os.ReadFile(p)
		if err != nil {
			continue
		}
		args := strings.Split(string(b), "\x00")
		if strings.HasSuffix(args[0], "swtpm") && strings.Contains(string(b), "dir="+stateDir) {
			found = append(found, p)
		}
	}
	return found
}

// TestBareBoot is the one real boot: it exercises every kind of QEMU
// option the harness builds (TPM, disk, fw_cfg, hostfwd) so that a
// malformed one makes QEMU refuse to start here rather than in a later,
// slower end-to-end test.
func TestBareBoot(t *testing.T) {
	kernel := testKernel(t)
	initrd := bareInitramfs(t)
	tmp := t.TempDir()
	state := filepath.Join(tmp, "tpm")
	disk := filepath.Join(tmp, "disk.img")
	param := filepath.Join(tmp, "params")
	if err := os.WriteFile(param, []byte("hello"), 0o644); err != nil {
		t.Fatal(err)
	}

	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	var console bytes.Buffer
	start := time.Now()
	n := launchT(t, ctx, launch.NodeOptions{
		Kernel:        kernel,
		Initramfs:     initrd,
		Cmdline:       "console=ttyS0 panic=-1",
		TPMStateDir:   state,
		DiskPath:      disk,
		DiskSizeBytes: 64 << 20,
		FwCfg:         map[string]string{"opt/plinth/parameters": param},
		HostForwards:  []launch.Forward{{HostPort: freePorts(t, 1)[0], GuestPort: 22}},
		Console:       &console,
	})
	if fi, err := os.Stat(disk); err != nil || fi.Size() != 64<<20 {
		t.Errorf("disk not created with the requested size: %v %v", fi, err)
	}
	tpm := n.TPMProcess()
	if tpm == nil {
		log, _ := os.ReadFile(filepath.Join(n.WorkDir(), "swtpm.log"))
		t.Fatalf("swtpm exited while qemu is starting; swtpm.log:\n%s", log)
	}
	swtpmPid := tpm.Pid

	m, idx, err := n.WaitForLineAfter(ctx, 0, regexp.MustCompile(`^bareinit: reached userspace uptime=([0-9.]+)`))
	if err != nil {
		t.Fatal(err)
	}
	uptime, _ := strconv.ParseFloat(m[1], 64)
	if err := n.Wait(ctx); err != nil {
		t.Fatalf("qemu did not power off cleanly: %v", err)
	}
	t.Logf("userspace at guest uptime %.2fs (console line %d), power-off after %.1fs wall", uptime, idx, time.Since(start).Seconds())

	// The history is kept: a late waiter still sees the kernel banner.
	if _, err := n.WaitForLine(ctx, regexp.MustCompile(`^\[ *[0-9.]+\] Linux version `)); err != nil {
		t.Errorf("history: %v", err)
	}
	// After exit, a line that never came fails fast with the evidence.
	_, err = n.WaitForLine(ctx, regexp.MustCompile(`never printed`))
	if !errors.Is(err, launch.ErrExited) || !strings.Contains(err.Error(), "exit status 0") || !strings.Contains(err.Error(), "bareinit: reached") {
		t.Errorf("WaitForLine after exit: %v", err)
	}
	for _, l := range n.Lines() {
		if strings.Contains(l, "\r") {
			t.Errorf("CR not stripped: %q", l)
		}
	}
	if !strings.Contains(console.String(), "bareinit: reached userspace") {
		t.Errorf("Console writer did not get the serial output")
	}
	logged, err := os.ReadFile(n.ConsolePath())
	if err != nil || !bytes.Equal(logged, console.Bytes()) {
		t.Errorf("console.log differs from the live console (%v)", err)
	}

	sockDir := n.SocketDir()
	if err := n.Close(); err != nil {
		t.Fatal(err)
	}
	if err := n.Close(); err != nil {
		t.Errorf("second Close: %v", err)
	}
	if err := syscall.Kill(swtpmPid, 0); !errors.Is(err, syscall.ESRCH) {
		t.Errorf("swtpm pid %d still exists after Close (kill 0: %v)", swtpmPid, err)
	}
	if left := swtpmsUsing(state); len(left) > 0 {
		t.Errorf("swtpm left running after Close: %v", left)
	}
	if _, err := os.Stat(sockDir); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("socket dir %s not removed: %v", sockDir, err)
	}
	if _, err := os.Stat(filepath.Join(state, "tpm2-00.permall")); err != nil {
		t.Errorf("TPM state not persisted: %v", err)
	}
}

// TestQMPAndKill needs no kernel: QEMU's own firmware is enough to have a
// QMP server, and killing it is the power-cut path tests rely on.
func TestQMPAndKill(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	// SeaBIOS prints nothing on the serial port.
	n := launchT(t, ctx, launch.NodeOptions{NoTPM: true, NoNetwork: true, MemoryMiB: 128, CPUs: 1, SilentStart: -1})
	ret, err := n.QMP(ctx, "query-status", nil)
	if err != nil || !bytes.Contains(ret, []byte(`"status"`)) {
		t.Fatalf("query-status: %s %v", ret, err)
	}
	if err := n.CtrlAltDel(ctx); err != nil {
		t.Fatal(err)
	}
	if err := n.PowerDown(ctx); err != nil {
		t.Fatal(err)
	}
	if err := n.Kill(); err != nil {
		t.Fatal(err)
	}
	select {
	case <-n.Exited():
	case <-ctx.Done():
		t.Fatal("qemu did not exit after Kill")
	}
	if err := n.Wait(ctx); err == nil || !strings.Contains(err.Error(), "killed") {
		t.Errorf("Wait after Kill = %v, want a killed error", err)
	}
	if _, err := n.WaitForLine(ctx, regexp.MustCompile(`x`)); !errors.Is(err, launch.ErrExited) || !strings.Contains(err.Error(), "killed") {
		t.Errorf("WaitForLine after Kill = %v", err)
	}
	if err := n.Kill(); err != nil {
		t.Errorf("second Kill: %v", err)
	}
	if err := n.PowerDown(ctx); !errors.Is(err, launch.ErrExited) {
		t.Errorf("PowerDown after exit = %v, want ErrExited", err)
	}
}

// TestSilentStartLaunchedAgain: a QEMU whose guest prints nothing (here:
// -S, never started) is reported, killed with its swtpm and launched
// again once; a second silent try is ErrSilentStart, with both reports
// and both tries' logs kept.
func TestSilentStartLaunchedAgain(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	dir := testDir(t)
	var progress bytes.Buffer
	n, err := launch.Launch(ctx, launch.NodeOptions{
		Name: "silent", WorkDir: dir, NoNetwork: true, MemoryMiB: 128, CPUs: 1,
		ExtraArgs: []string{"-S"}, SilentStart: 2 * time.Second, Progress: &progress,
	})
	if !errors.Is(err, launch.ErrSilentStart) {
		if n != nil {
			n.Close()
		}
		t.Fatalf("Launch = %v, want ErrSilentStart", err)
	}
	if got := strings.Count(progress.String(), "launching it again"); got != 1 {
		t.Errorf("progress said %d relaunches, want 1:\n%s", got, progress.String())
	}
	for try := 1; try <= launch.SilentStartTries; try++ {
		report, err := os.ReadFile(filepath.Join(dir, fmt.Sprintf("silent-start-%d.txt", try)))
		if err != nil {
			t.Fatal(err)
		}
		for _, want := range []string{`"status": "prelaunch"`, "qemu CPU time:", "state S wchan", "swtpm: running", "CPU#0"} {
			if !strings.Contains(string(report), want) {
				t.Errorf("report %d lacks %q:\n%s", try, want, report)
			}
		}
		if q, err := os.ReadFile(filepath.Join(dir, fmt.Sprintf("qemu.silent-start-%d.log", try))); err != nil || !strings.Contains(string(q), "# qemu-system-x86_64 ") {
			t.Errorf("try %d's qemu.log not kept: %v", try, err)
		}
		m := regexp.MustCompile(`qemu pid (\d+)`).FindSubmatch(report)
		if m == nil {
			t.Fatalf("report %d names no pid", try)
		}
		pid, _ := strconv.Atoi(string(m[1]))
		if err := syscall.Kill(pid, 0); !errors.Is(err, syscall.ESRCH) {
			t.Errorf("try %d's qemu (pid %d) still there: %v", try, pid, err)
		}
	}
}
