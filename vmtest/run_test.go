//go:build built

package vmtest

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"
)

// TestRunFirstMinutes is the README's first minutes: `plinthctl run`
// (what `make run` starts) in a fresh state directory, then exactly the
// commands it printed, parsed from its output: cluster takeownership once
// the console says the cluster is bootstrapped, node list, node logs, and
// the cluster kubeconfig line, which waits for the API server and lists the nodes
// with the project's kubectl. The node is Ready and runs a pod of the
// test image. Ctrl-C (SIGINT) powers it off; a second run with the same
// state boots the same node from its disk (no new parameters, no new
// owner key), which the owner still owns and whose Kubernetes still has
// the pod.
func TestRunFirstMinutes(t *testing.T) {
	parallel(t, 200*time.Second) // 144 s measured on a fast afternoon
	img := testImage(t)
	ctl := buildPlinthctl(t)
	k := newKubectl(t, "")
	ctx, cancel := context.WithTimeout(context.Background(), 25*time.Minute)
	defer cancel()
	dir := testDir(t)
	state := filepath.Join(dir, "state")
	ports := freePorts(t, 3)
	args := []string{"run", "--image", img.Dir, "--state", state,
		"--curator-port", strconv.Itoa(ports[0]), "--mgmt-port", strconv.Itoa(ports[1]), "--kubernetes-port", strconv.Itoa(ports[2])}

	run := startRun(t, ctx, dir, string(ctl), args)
	if !run.said("first run: writing bootstrap parameters") {
		t.Errorf("the first run does not say it writes parameters:\n%s", run.stderrText())
	}
	printed := run.commands(t)
	takeOwnership, nodesList, logs, kubeconfig := printed.find(t, " cluster takeownership "), printed.find(t, " node list "),
		printed.find(t, " node logs "), printed.find(t, " cluster kubeconfig ")
	for _, want := range []string{"--wait ", "--kubeconfig ", " get nodes", k.bin} {
		if !strings.Contains(kubeconfig, want) {
			t.Errorf("the printed kubeconfig command %q lacks %q", kubeconfig, want)
		}
	}
	if !run.said("under TCG its API server serves about") && !run.said("serves within a minute") {
		t.Errorf("run does not say how long the API server takes:\n%s", run.stderrText())
	}

	// "once the console shows "…", in another shell:"
	m := regexp.MustCompile(`once the console shows "([^"]+)"`).FindStringSubmatch(run.stderrText())
	if m == nil {
		t.Fatalf("run does not say when to take ownership:\n%s", run.stderrText())
	}
	if err := run.waitConsole(ctx, m[1], 5*time.Minute); err != nil {
		t.Fatal(err)
	}
	runPrinted(t, ctx, dir, []string{takeOwnership})
	id := regexp.MustCompile(`plinth-[0-9a-f]{16,}`).FindString(runPrinted(t, ctx, dir, []string{nodesList}))
	if id == "" {
		t.Fatal("node list, as printed, names no node")
	}
	if out := runPrinted(t, ctx, dir, []string{strings.ReplaceAll(logs, "NODE", id)}); !strings.Contains(out, "root") {
		t.Errorf("logs, as printed, show no entry of the node:\n%s", out)
	}
	if out := runPrinted(t, ctx, dir, []string{kubeconfig}); !strings.Contains(out, "STATUS") && !strings.Contains(out, "No resources found") {
		t.Fatalf("the kubeconfig line, as printed, did not list the Kubernetes nodes:\n%s", out)
	}

	// The node runs pods: Ready, and a pod of the test image answers.
	k.kubeconfig = filepath.Join(state, "kubeconfig")
	k.until(t, ctx, 10*time.Minute, "the node Ready", func(out string) bool { return out == "True" },
		"get", "node", id, "-o", `jsonpath={.status.conditions[?(@.type=="Ready")].status}`)
	k.apply(t, ctx, podOn("first", id))
	if _, err := k.wait(ctx, 10*time.Minute, "Ready", "pod/first"); err != nil {
		t.Fatal(err)
	}
	if out := k.run(t, ctx, "exec", "first", "--", "/testpod", "print", "hello from make run"); !strings.Contains(out, "hello from make run") {
		t.Fatalf("kubectl exec in the pod: %q", out)
	}

	// Ctrl-C: the node powers off and run ends cleanly.
	run.interrupt(t, 3*time.Minute)

	// make run a second time: the same node from its disk.
	paramsBefore, _ := os.ReadFile(filepath.Join(state, "parameters.pb"))
	run = startRun(t, ctx, dir, string(ctl), args)
	if run.said("first run") || !run.said("you own this node") {
		t.Errorf("the second run does not boot the node it owns:\n%s", run.stderrText())
	}
	again := run.commands(t)
	if again.has(" cluster takeownership ") {
		t.Errorf("the second run prints cluster takeownership for an owned node:\n%s", run.stderrText())
	}
	deadline := time.Now().Add(5 * time.Minute)
	for out := ""; !strings.Contains(out, id) || !strings.Contains(out, "HEALTHY"); out, _ = outputOf(ctx, dir, again.find(t, " node list ")) {
		if time.Now().After(deadline) {
			t.Fatalf("the node is not back HEALTHY as %s after the second run:\n%s", id, out)
		}
		time.Sleep(3 * time.Second)
	}
	k.until(t, ctx, 10*time.Minute, "the pod kept across the second run", func(out string) bool { return out == "first" },
		"get", "pod", "first", "-o", "jsonpath={.metadata.name}")
	if paramsAfter, _ := os.ReadFile(filepath.Join(state, "parameters.pb")); string(paramsAfter) != string(paramsBefore) {
		t.Error("the second run rewrote the node's parameters")
	}
	run.interrupt(t, 3*time.Minute)
}

// runProcess is a `plinthctl run` started by startRun: its stderr (what
// it says, the commands it prints) and stdout (the node's console) are
// collected line by line.
type runProcess struct {
	cmd  *exec.Cmd
	done chan struct{}
	err  error

	mu      sync.Mutex
	stderr  []string
	console []string
	changed chan struct{} // closed and replaced when a line arrives
}

// startRun starts plinthctl run in dir and waits until it printed its
// guide (the line naming the NODE placeholder ends it).
func startRun(t *testing.T, ctx context.Context, dir, plinthctl string, args []string) *runProcess {
	t.Helper()
	r := &runProcess{cmd: exec.Command(plinthctl, args...), done: make(chan struct{}), changed: make(chan struct{})}
	r.cmd.Dir = dir
	r.cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	stdout, _ := r.cmd.StdoutPipe()
	stderr, _ := r.cmd.StderrPipe()
	if err := r.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	var wg sync.WaitGroup
	wg.Add(2)
	go r.collect(&wg, stdout, &r.console)
	go r.collect(&wg, stderr, &r.stderr)
	go func() {
		wg.Wait()
		r.err = r.cmd.Wait()
		close(r.done)
	}()
	t.Cleanup(func() {
		select {
		case <-r.done:
		default:
			syscall.Kill(-r.cmd.Process.Pid, syscall.SIGKILL)
			<-r.done
		}
		t.Logf("plinthctl run said:\n%s", r.stderrText())
	})
	if err := r.wait(ctx, 2*time.Minute, func() bool { return r.said("NODE is the node's ID") }); err != nil {
		t.Fatalf("plinthctl run printed no guide: %v\n%s", err, r.stderrText())
	}
	return r
}

func (r *runProcess) collect(wg *sync.WaitGroup, rd io.Reader, into *[]string) {
	defer wg.Done()
	sc := bufio.NewScanner(rd)
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	for sc.Scan() {
		r.mu.Lock()
		*into = append(*into, sc.Text())
		close(r.changed)
		r.changed = make(chan struct{})
		r.mu.Unlock()
	}
}

// wait waits until ok, the process exits or timeout passes.
func (r *runProcess) wait(ctx context.Context, timeout time.Duration, ok func() bool) error {
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	for {
		r.mu.Lock()
		changed := r.changed
		r.mu.Unlock()
		if ok() {
			return nil
		}
		select {
		case <-changed:
		case <-r.done:
			if ok() {
				return nil
			}
			return fmt.Errorf("plinthctl run exited: %v", r.err)
		case <-ctx.Done():
			return ctx.Err()
		}
	}
}

func (r *runProcess) waitConsole(ctx context.Context, substr string, timeout time.Duration) error {
	err := r.wait(ctx, timeout, func() bool {
		r.mu.Lock()
		defer r.mu.Unlock()
		for _, l := range r.console {
			if strings.Contains(l, substr) {
				return true
			}
		}
		return false
	})
	if err != nil {
		r.mu.Lock()
		defer r.mu.Unlock()
		tail := r.console[max(0, len(r.console)-20):]
		return fmt.Errorf("the console shows no %q: %v\n%s", substr, err, strings.Join(tail, "\n"))
	}
	return nil
}

func (r *runProcess) said(substr string) bool {
	return strings.Contains(r.stderrText(), substr)
}

func (r *runProcess) stderrText() string {
	r.mu.Lock()
	defer r.mu.Unlock()
	return strings.Join(r.stderr, "\n")
}

// printedCommands are the command lines run printed (indented by two
// spaces).
type printedCommands []string

func (r *runProcess) commands(t *testing.T) printedCommands {
	t.Helper()
	r.mu.Lock()
	defer r.mu.Unlock()
	var out printedCommands
	for _, l := range r.stderr {
		if strings.HasPrefix(l, "  ") {
			out = append(out, strings.TrimSpace(l))
		}
	}
	return out
}

func (p printedCommands) has(substr string) bool {
	for _, c := range p {
		if strings.Contains(c, substr) {
			return true
		}
	}
	return false
}

func (p printedCommands) find(t *testing.T, substr string) string {
	t.Helper()
	for _, c := range p {
		if strings.Contains(c, substr) {
			return c
		}
	}
	t.Fatalf("plinthctl run printed no command with %q: %q", substr, p)
	return ""
}

// interrupt is the user's Ctrl-C: SIGINT, then the node powers off and
// run exits without an error.
func (r *runProcess) interrupt(t *testing.T, timeout time.Duration) {
	t.Helper()
	r.cmd.Process.Signal(os.Interrupt)
	select {
	case <-r.done:
		if r.err != nil {
			t.Fatalf("plinthctl run after Ctrl-C: %v\n%s", r.err, r.stderrText())
		}
	case <-time.After(timeout):
		t.Fatalf("plinthctl run did not end within %v of Ctrl-C", timeout)
	}
}

// outputOf runs one printed command line and returns its output.
func outputOf(ctx context.Context, dir, line string) (string, error) {
	cmd := exec.CommandContext(ctx, "bash", "-euo", "pipefail", "-c", line)
	cmd.Dir = dir
	out, err := cmd.CombinedOutput()
	return string(out), err
}

// freePorts are n loopback ports nothing listened on a moment ago.
func freePorts(t *testing.T, n int) []int {
	t.Helper()
	var out []int
	var ls []net.Listener
	for range n {
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		ls = append(ls, l)
		out = append(out, l.Addr().(*net.TCPAddr).Port)
	}
	for _, l := range ls {
		l.Close()
	}
	return out
}
