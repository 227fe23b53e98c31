package launch

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"strings"
	"syscall"
	"time"

	"plinth.dev/plinth/platform/supervisor"
)

// swtpm is the software TPM process backing one node.
type swtpm struct {
	cmd  *exec.Cmd
	log  *os.File
	done chan struct{}
}

// swtpmStartTimeout bounds the wait for the control socket; swtpm creates
// it within milliseconds, so hitting this means swtpm is wedged.
const swtpmStartTimeout = 10 * time.Second

func startSwtpm(ctx context.Context, stateDir, sock, logPath string) (*swtpm, error) {
	// swtpm's option parser splits on commas and has no escape for them.
	if strings.Contains(stateDir, ",") || strings.Contains(sock, ",") {
		return nil, fmt.Errorf("swtpm: paths must not contain commas: %q", stateDir)
	}
	if err := os.MkdirAll(stateDir, 0o700); err != nil {
		return nil, fmt.Errorf("swtpm: %w", err)
	}
	logf, err := os.Create(logPath)
	if err != nil {
		return nil, fmt.Errorf("swtpm: %w", err)
	}
	cmd := exec.Command("swtpm", "socket", "--tpm2",
		"--tpmstate", "dir="+stateDir,
		"--ctrl", "type=unixio,path="+sock,
		"--flags", "startup-clear",
		// Exit when QEMU's connection goes away, so a killed or powered-off
		// node never leaves a swtpm holding the state dir's lock.
		"--terminate")
	cmd.Stdout = logf
	cmd.Stderr = logf
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL, Setpgid: true}
	if err := cmd.Start(); err != nil {
		logf.Close()
		return nil, fmt.Errorf("swtpm: %w", err)
	}
	t := &swtpm{cmd: cmd, log: logf, done: make(chan struct{})}
	go func() {
		cmd.Wait()
		close(t.done)
	}()

	// QEMU refuses to start if the socket is not there yet.
	ctx, cancel := context.WithTimeout(ctx, swtpmStartTimeout)
	defer cancel()
	for {
		if _, err := os.Stat(sock); err == nil {
			return t, nil
		}
		select {
		case <-t.done:
			t.log.Close()
			return nil, fmt.Errorf("swtpm exited during startup (%s)%s", cmd.ProcessState, fileTail(logPath, 10))
		default:
		}
		if supervisor.Sleep(ctx, 10*time.Millisecond) != nil {
			t.stop(false)
			return nil, fmt.Errorf("swtpm: waiting for %s: %w", sock, ctx.Err())
		}
	}
}

// stop ends swtpm. With grace, swtpm is first given a moment to exit by
// itself after QEMU went away: that is its normal way out and lets it
// finish writing state.
func (t *swtpm) stop(grace bool) error {
	defer t.log.Close()
	wait := func(d time.Duration) bool {
		select {
		case <-t.done:
			return true
		case <-time.After(d):
			return false
		}
	}
	if grace && wait(time.Second) {
		return nil
	}
	if err := t.cmd.Process.Signal(syscall.SIGTERM); err != nil && !errors.Is(err, os.ErrProcessDone) {
		return fmt.Errorf("swtpm: %w", err)
	}
	if wait(2 * time.Second) {
		return nil
	}
	t.cmd.Process.Kill()
	if !wait(5 * time.Second) {
		return fmt.Errorf("swtpm (pid %d) did not exit after SIGKILL", t.cmd.Process.Pid)
	}
	return nil
}
