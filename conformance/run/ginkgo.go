package main

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"

	"plinth.dev/plinth/internal/testutil/e2especs"
)

// dryRun lists the specs focus and skip select, without a cluster.
func (c *runCmd) dryRun(ctx context.Context, focus, skip string) ([]string, error) {
	progress := filepath.Join(c.out, "dry-run.jsonl")
	os.Remove(progress)
	defer os.Remove(progress)
	cmd := exec.CommandContext(ctx, c.e2e, "--ginkgo.dry-run", "--ginkgo.focus="+focus, "--ginkgo.skip="+skip,
		"--provider=local", "--kubeconfig=/dev/null")
	cmd.Env = append(os.Environ(), e2especs.ProgressEnv+"="+progress)
	if out, err := cmd.CombinedOutput(); err != nil {
		return nil, fmt.Errorf("e2e.test dry run: %v\n%s", err, tail(out, 20))
	}
	specs, err := e2especs.ReadProgress(progress)
	if err != nil && !errors.Is(err, os.ErrNotExist) {
		return nil, err
	}
	names := make([]string, len(specs))
	for i, s := range specs {
		names[i] = s.Name
	}
	if len(names) == 0 {
		return nil, fmt.Errorf("FOCUS %q and SKIP %q select no spec", focus, skip)
	}
	return names, nil
}

// ginkgoRun runs one attempt: ginkgo with procs processes over e2e.test,
// its output into log, one line per finished spec on stdout. An attempt
// that finishes no spec for c.stall, or in which a node stops being
// Ready (nodes.go), is interrupted (SIGINT: ginkgo ends the running
// specs as interrupted and writes its reports; SIGKILL after c.grace),
// the reason added to the interrupted specs' failures. It returns how
// many specs finished (interrupted ones too) and whether a node was
// lost.
func (c *runCmd) ginkgoRun(ctx context.Context, kubeconfig, focus, skip string, procs int, log string, r *results, planned int) (finished int, nodeLost bool, err error) {
	lf, err := os.Create(log)
	if err != nil {
		return 0, false, err
	}
	defer lf.Close()
	// The seed orders the specs of the whole suite, those not selected
	// too: the same seed gives a selection's specs the same order in
	// every attempt and round, and in a later run with another selection.
	args := []string{"run", "--no-color", fmt.Sprintf("--procs=%d", procs), fmt.Sprintf("--seed=%d", c.seed), "--timeout=" + c.timeout.String(),
		"--focus=" + focus, "--skip=" + skip, "--poll-progress-after=10m"}
	if c.verbose {
		args = append(args, "-v") // each spec's output: the log a certification submits
	}
	args = append(args, c.e2e, "--")
	suite := e2especs.SuiteFlags(kubeconfig, c.kubectl, c.out)
	if c.leftBehind > 0 {
		suite = append(suite, fmt.Sprintf("--allowed-not-ready-nodes=%d", c.leftBehind))
	}
	// ginkgo and the e2e.test processes it forks run niced: the nodes
	// under test get the host's CPU first, as on a machine of their own.
	// nice(1) sets it before ginkgo runs, so nothing starts at the
	// default priority (TestRoundsEndHangingSpecs).
	cmd := exec.Command("nice", append([]string{"-n", strconv.Itoa(c.clientNice), c.ginkgo}, append(args, suite...)...)...)
	cmd.Env = append(os.Environ(), e2especs.ProgressEnv+"="+r.path)
	cmd.Stdout, cmd.Stderr = lf, lf
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	r.reason = ""
	watch := c.watchNodes(kubeconfig)
	if c.nodeEvery > 0 {
		watch.check(ctx) // the nodes as the attempt begins
	}
	if err := cmd.Start(); err != nil {
		return 0, false, err
	}
	done := make(chan error, 1)
	go func() { done <- cmd.Wait() }()
	interrupt := func(why string) {
		fmt.Printf("conformance: %s: interrupting the attempt\n", why)
		r.reason = why
		syscall.Kill(-cmd.Process.Pid, syscall.SIGINT)
		go func() {
			// ginkgo writes its reports on the first interrupt; a kill
			// after a grace period ends what still hangs.
			time.Sleep(c.grace)
			syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL)
		}()
	}
	last := time.Now()
	tick := time.NewTicker(c.pollEvery)
	defer tick.Stop()
	interrupted := false
	for {
		select {
		case err := <-done:
			finished += r.poll(planned, finished)
			return finished, nodeLost, err
		case <-ctx.Done():
			if !interrupted {
				interrupted = true
				interrupt("stopped")
			}
		case <-tick.C:
			if n := r.poll(planned, finished); n > 0 {
				finished += n
				last = time.Now()
			}
			if interrupted {
				continue
			}
			if time.Since(last) > c.stall {
				interrupted = true
				interrupt(fmt.Sprintf("no spec finished for %v", c.stall.Round(time.Minute)))
			} else if c.nodeEvery > 0 {
				if why := watch.check(ctx); why != "" {
					interrupted, nodeLost = true, true
					interrupt(why)
				}
			}
		}
	}
}

// tail is the last n lines of out.
func tail(out []byte, n int) string {
	lines := strings.Split(strings.TrimRight(string(out), "\n"), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, "\n")
}
