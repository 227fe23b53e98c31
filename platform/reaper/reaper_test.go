package reaper

import (
	"bytes"
	"fmt"
	"os"
	"os/exec"
	"os/signal"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// The reaper only makes sense as PID 1, so the tests run it as PID 1 of a
// new PID and mount namespace (root needed, as in CI). The test binary
// plays every part, chosen by roleEnv:
//
//	test ──clone(NEWPID|NEWNS)──► pid1: reaper.Run ──► core ──► maker ──► orphan
//	                                                   (maker exits at once, so the
//	                                                    orphan is reparented to pid1)

const roleEnv = "REAPER_TEST_ROLE"

func TestMain(m *testing.M) {
	switch os.Getenv(roleEnv) {
	case "pid1":
		// Keep our mounts out of the host's mount namespace.
		if err := unix.Mount("", "/", "", unix.MS_REC|unix.MS_PRIVATE, ""); err != nil {
			fmt.Println("make / private:", err)
			os.Exit(1)
		}
		line := func(msg string) string { return "pid1: " + msg }
		Run(os.Stdout, line, os.Args[0], []string{os.Args[0]}, append(os.Environ(), roleEnv+"=core"))
	case "core":
		os.Exit(core())
	case "maker":
		orphan := exec.Command(os.Args[0])
		orphan.Env = append(os.Environ(), roleEnv+"=orphan")
		if err := orphan.Start(); err != nil {
			fmt.Println("start orphan:", err)
			os.Exit(1)
		}
		fmt.Println("ORPHAN", orphan.Process.Pid)
		os.Exit(0)
	case "orphan":
		time.Sleep(200 * time.Millisecond)
		os.Exit(0)
	}
	os.Exit(m.Run())
}

// core makes an orphan, checks PID 1 reaped it, then behaves as
// REAPER_TEST_CORE says: "exit:N" or "wait-signal".
func core() int {
	maker := exec.Command(os.Args[0])
	maker.Env = append(os.Environ(), roleEnv+"=maker")
	out, err := maker.Output()
	if err != nil {
		fmt.Println("maker:", err)
		return 1
	}
	pid, _ := strconv.Atoi(strings.TrimSpace(strings.TrimPrefix(string(out), "ORPHAN ")))
	deadline := time.Now().Add(5 * time.Second)
	for {
		stat, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
		if err != nil {
			fmt.Println("ORPHAN REAPED")
			break
		}
		if time.Now().After(deadline) {
			fmt.Printf("ORPHAN NOT REAPED: %s\n", stat)
			break
		}
		time.Sleep(20 * time.Millisecond)
	}
	fmt.Println("CORE NICE", niceOf("self"))
	mode := os.Getenv("REAPER_TEST_CORE")
	if mode == "wait-signal" {
		sigs := make(chan os.Signal, 1)
		signal.Notify(sigs, unix.SIGTERM)
		fmt.Println("CORE WAITING")
		s := <-sigs
		fmt.Println("CORE GOT", s)
		return ExitPowerOff
	}
	code, _ := strconv.Atoi(strings.TrimPrefix(mode, "exit:"))
	return code
}

// niceOf is the nice value of process pid's main thread ("self": this
// one's), the 19th field of /proc/PID/stat.
func niceOf(pid string) string {
	stat, err := os.ReadFile("/proc/" + pid + "/stat")
	if err != nil {
		return err.Error()
	}
	// The command (field 2) may hold spaces; the fields after it do not.
	fields := strings.Fields(string(stat[bytes.LastIndexByte(stat, ')')+1:]))
	return fields[16]
}

func runPID1(t *testing.T, coreMode string, during func(p *os.Process, out *bytes.Buffer)) (string, syscall.WaitStatus) {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Fatal("the reaper tests need root for PID namespaces (CI runs as root)")
	}
	var out bytes.Buffer
	cmd := exec.Command(os.Args[0])
	cmd.Env = append(os.Environ(), roleEnv+"=pid1", "REAPER_TEST_CORE="+coreMode)
	cmd.Stdout, cmd.Stderr = &syncWriter{b: &out}, &syncWriter{b: &out}
	cmd.SysProcAttr = &syscall.SysProcAttr{Cloneflags: syscall.CLONE_NEWPID | syscall.CLONE_NEWNS}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	if during != nil {
		during(cmd.Process, &out)
	}
	done := make(chan struct{})
	go func() { cmd.Wait(); close(done) }()
	select {
	case <-done:
	case <-time.After(30 * time.Second):
		cmd.Process.Kill()
		<-done
		t.Fatalf("PID 1 did not finish; output:\n%s", out.String())
	}
	return out.String(), cmd.ProcessState.Sys().(syscall.WaitStatus)
}

type syncWriter struct{ b *bytes.Buffer }

var outMu = make(chan struct{}, 1)

func (w *syncWriter) Write(p []byte) (int, error) {
	outMu <- struct{}{}
	defer func() { <-outMu }()
	return w.b.Write(p)
}

func snapshot(b *bytes.Buffer) string {
	outMu <- struct{}{}
	defer func() { <-outMu }()
	return b.String()
}

// reboot(2) from the init of a PID namespace kills that init with SIGINT
// for power-off and SIGHUP for restart: that is how the test sees which
// one PID 1 chose.
func checkEnd(t *testing.T, out string, ws syscall.WaitStatus, wantSig syscall.Signal, wantLine string) {
	t.Helper()
	if !strings.Contains(out, "ORPHAN REAPED") {
		t.Errorf("orphan not reaped by PID 1:\n%s", out)
	}
	if !strings.Contains(out, wantLine) {
		t.Errorf("PID 1 did not say %q:\n%s", wantLine, out)
	}
	if !ws.Signaled() || ws.Signal() != wantSig {
		t.Errorf("namespace init ended with %v, want killed by %v (reboot command); output:\n%s", ws, wantSig, out)
	}
}

func TestCoreExitPowersOff(t *testing.T) {
	out, ws := runPID1(t, "exit:0", nil)
	checkEnd(t, out, ws, syscall.SIGINT, "core finished, powering off")
}

func TestCoreExitReboots(t *testing.T) {
	out, ws := runPID1(t, fmt.Sprintf("exit:%d", ExitReboot), nil)
	checkEnd(t, out, ws, syscall.SIGHUP, "core finished, rebooting")
}

func TestCoreCrashReboots(t *testing.T) {
	out, ws := runPID1(t, "exit:3", nil)
	checkEnd(t, out, ws, syscall.SIGHUP, "core died (exit status 3), syncing and rebooting")
}

func TestSignalForwardedToCore(t *testing.T) {
	out, ws := runPID1(t, "wait-signal", func(p *os.Process, out *bytes.Buffer) {
		deadline := time.Now().Add(10 * time.Second)
		for !strings.Contains(snapshot(out), "CORE WAITING") {
			if time.Now().After(deadline) {
				t.Errorf("core never got ready:\n%s", snapshot(out))
				return
			}
			time.Sleep(20 * time.Millisecond)
		}
		p.Signal(syscall.SIGTERM)
	})
	if !strings.Contains(out, "CORE GOT terminated") {
		t.Errorf("SIGTERM to PID 1 was not forwarded to the core:\n%s", out)
	}
	checkEnd(t, out, ws, syscall.SIGINT, "core finished, powering off")
}

// TestCorePriority: the core runs above the default priority (CoreNice),
// from its first thread on.
func TestCorePriority(t *testing.T) {
	out, ws := runPID1(t, "exit:0", nil)
	checkEnd(t, out, ws, syscall.SIGINT, "core finished, powering off")
	if want := fmt.Sprintf("CORE NICE %d\n", CoreNice); !strings.Contains(out, want) {
		t.Errorf("the core's priority: want %q in\n%s", want, out)
	}
}
