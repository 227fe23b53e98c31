package main

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"os/signal"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"plinth.dev/plinth/internal/testutil/e2especs"
)

// fakeGinkgoEnv makes the test binary a fake ginkgo (fakeGinkgo): its
// value is the specs, "name=behaviour" separated by commas, run in that
// order.
const fakeGinkgoEnv = "PLINTH_FAKE_GINKGO"

// suiteDescription is upstream's (test/e2e RunE2ETests).
const suiteDescription = "Kubernetes e2e suite"

// fakeKubectlEnv makes the test binary a fake kubectl (fakeKubectl)
// when its first argument is --kubeconfig: its value is a file holding
// what `kubectl get nodes -o nodeColumns` prints.
const fakeKubectlEnv = "PLINTH_FAKE_KUBECTL"

// fakePlinthctlEnv makes the test binary a fake plinthctl (fakePlinthctl)
// when its arguments start with node logs.
const fakePlinthctlEnv = "PLINTH_FAKE_PLINTHCTL"

func TestMain(m *testing.M) {
	if os.Getenv(fakePlinthctlEnv) != "" && len(os.Args) > 2 && os.Args[1] == "node" && os.Args[2] == "logs" {
		os.Exit(fakePlinthctl(os.Args[1:]))
	}
	if os.Getenv(fakePlinthctlEnv) != "" && len(os.Args) > 2 && os.Args[1] == "role" && os.Args[2] == "taint" {
		os.Exit(fakeTaint(os.Args[1:]))
	}
	if nodes := os.Getenv(fakeKubectlEnv); nodes != "" && len(os.Args) > 1 && os.Args[1] == "--kubeconfig" {
		os.Exit(fakeKubectl(nodes, os.Args[1:]))
	}
	if specs := os.Getenv(fakeGinkgoEnv); specs != "" {
		os.Exit(fakeGinkgo(specs, os.Args[1:]))
	}
	os.Exit(m.Run())
}

// fakeKubectl prints the nodes file; `get --raw PATH`, "metrics of
// PATH" (a PATH naming node "dead": an error).
func fakeKubectl(nodes string, args []string) int {
	if i := slices.Index(args, "--raw"); i >= 0 && i+1 < len(args) {
		if strings.Contains(args[i+1], "/dead/") {
			fmt.Fprintln(os.Stderr, "Error from server (ServiceUnavailable)")
			return 1
		}
		fmt.Printf("metrics of %s\n", args[i+1])
		return 0
	}
	b, err := os.ReadFile(nodes)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	os.Stdout.Write(b)
	return 0
}

// fakePlinthctl is `plinthctl node logs --config DIR ID`: node "dead" does not
// answer (an error on stderr), "slow" answers after the test's timeout,
// others print two log lines naming themselves and the owner directory.
func fakePlinthctl(args []string) int {
	if len(args) != 5 || args[0] != "node" || args[1] != "logs" || args[2] != "--config" {
		fmt.Fprintf(os.Stderr, "fake plinthctl: unexpected arguments %q\n", args)
		return 2
	}
	switch id := args[4]; id {
	case "dead":
		fmt.Fprintln(os.Stderr, "plinthctl: rpc error: code = Unavailable desc = connection refused")
		return 1
	case "slow":
		fmt.Println("slow first line")
		time.Sleep(time.Hour)
		return 0
	default:
		fmt.Printf("%s first line (owner %s)\n%s second line\n", id, args[3], id)
		return 0
	}
}

// fakeTaint is `plinthctl role taint ID --kube-server S` with the owner
// directory in PLINTH_CONFIG: it fails as plinthctl does while the file
// registered there is missing (no Node object yet), and then records its
// arguments in the file tainted.
func fakeTaint(args []string) int {
	dir := os.Getenv("PLINTH_CONFIG")
	if _, err := os.Stat(filepath.Join(dir, "registered")); err != nil {
		fmt.Fprintf(os.Stderr, "plinthctl: nodes %q not found\n", args[2])
		return 1
	}
	if err := os.WriteFile(filepath.Join(dir, "tainted"), []byte(strings.Join(args, " ")), 0o644); err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	return 0
}

// TestTaintNodeWaitsForTheNode: the taint is retried until the node has
// registered; a node that never does is an error with plinthctl's words.
func TestTaintNodeWaitsForTheNode(t *testing.T) {
	self, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	t.Setenv(fakePlinthctlEnv, "1")
	c := &runCmd{plinthctl: self}
	owner := t.TempDir()
	go func() {
		time.Sleep(200 * time.Millisecond)
		os.WriteFile(filepath.Join(owner, "registered"), nil, 0o644)
	}()
	if err := c.taintNode(context.Background(), "plinth-n0", "127.0.0.1:6443", owner, 20*time.Millisecond, time.Minute); err != nil {
		t.Fatal(err)
	}
	if b, err := os.ReadFile(filepath.Join(owner, "tainted")); err != nil || string(b) != "role taint plinth-n0 --kube-server 127.0.0.1:6443" {
		t.Errorf("plinthctl ran as %q (%v)", b, err)
	}

	err = c.taintNode(context.Background(), "plinth-n1", "127.0.0.1:6443", t.TempDir(), 20*time.Millisecond, 100*time.Millisecond)
	if err == nil || !strings.Contains(err.Error(), `nodes "plinth-n1" not found`) {
		t.Errorf("never registered: %v", err)
	}
}

// setNodes writes the fake kubectl's nodes file (whole, by a rename):
// "name=status reason", space-separated.
func setNodes(t *testing.T, file, nodes string) {
	var b strings.Builder
	for _, n := range strings.Fields(nodes) {
		name, rest, _ := strings.Cut(n, "=")
		status, reason, _ := strings.Cut(rest, ":")
		fmt.Fprintf(&b, "%s\t%s\t%s\tmessage of %s\n", name, status, reason, reason)
	}
	// t.Error, not Fatal: the test calls it from a goroutine too.
	if err := os.WriteFile(file+".new", []byte(b.String()), 0o644); err != nil {
		t.Error(err)
	} else if err := os.Rename(file+".new", file); err != nil {
		t.Error(err)
	}
}

// fakeGinkgo runs the specs its --focus selects, writing a progress line
// for each as the suite's hook does. Behaviours: pass, fail; hang (until
// SIGINT, then "interrupted", as ginkgo reports a spec it interrupts);
// stubborn (ignores SIGINT, writes nothing: only SIGKILL ends it);
// lost (the first time, hangs as hang does; then passes if every node
// of the fake kubectl's file is Ready or the suite is told how many are
// not, and fails if not).
func fakeGinkgo(specs string, args []string) int {
	focus := regexp.MustCompile("")
	for _, a := range args {
		if f, ok := strings.CutPrefix(a, "--focus="); ok {
			focus = regexp.MustCompile(f)
		}
	}
	out, err := os.OpenFile(os.Getenv("PLINTH_CONFORMANCE_PROGRESS"), os.O_APPEND|os.O_CREATE|os.O_WRONLY, 0o644)
	if err != nil {
		return 2
	}
	// Each attempt's --seed and the nice value it runs at, one line
	// each, for the test to compare. getpriority answers 20 - nice.
	if f, err := os.OpenFile(filepath.Join(filepath.Dir(out.Name()), "seeds"), os.O_APPEND|os.O_CREATE|os.O_WRONLY, 0o644); err == nil {
		for _, a := range args {
			if strings.HasPrefix(a, "--seed=") {
				prio, _ := syscall.Getpriority(syscall.PRIO_PROCESS, 0)
				fmt.Fprintf(f, "%s nice=%d\n", a, 20-prio)
			}
		}
		f.Close()
	}
	report := func(name, state, failure string) {
		b, _ := json.Marshal(e2especs.Spec{State: state, Seconds: 0.1, Name: name, Failure: failure})
		out.Write(append(b, '\n'))
	}
	sig := make(chan os.Signal, 1)
	signal.Notify(sig, syscall.SIGINT)
	code := 0
	for _, s := range strings.Split(specs, ",") {
		name, behaviour, _ := strings.Cut(s, "=")
		// As ginkgo matches a focus: the suite's description, a space,
		// the spec's full name.
		if !focus.MatchString(suiteDescription + " " + name) {
			continue
		}
		switch behaviour {
		case "pass":
			report(name, "passed", "")
		case "fail":
			report(name, "failed", "it failed")
			code = 1
		case "hang":
			<-sig
			report(name, "interrupted", "Interrupted by User")
			return 1
		case "stubborn":
			select {}
		case "lost":
			marker := filepath.Join(filepath.Dir(out.Name()), "ran-"+name)
			if _, err := os.Stat(marker); err != nil {
				os.WriteFile(marker, nil, 0o644)
				<-sig
				report(name, "interrupted", "Interrupted by User")
				return 1
			}
			// As the suite does: it waits for every node unless told
			// how many may be not Ready.
			nodes, _ := os.ReadFile(os.Getenv(fakeKubectlEnv))
			down := strings.Count(string(nodes), "\tFalse\t") + strings.Count(string(nodes), "\tUnknown\t")
			if down > 0 && !slices.Contains(args, fmt.Sprintf("--allowed-not-ready-nodes=%d", down)) {
				report(name, "failed", fmt.Sprintf("%d nodes not Ready, not allowed", down))
				code = 1
			} else {
				report(name, "passed", "")
			}
		}
	}
	return code
}

// TestRoundsEndHangingSpecs: a spec that hangs is interrupted, run once
// more, and then stays failed; specs that did not get to run in an
// interrupted attempt run in the next; a ginkgo that ignores the
// interrupt is killed, and what it never finished is reported not run.
// The run ends, and the summary says all of it.
func TestRoundsEndHangingSpecs(t *testing.T) {
	exe, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	t.Setenv(fakeGinkgoEnv, "a=pass,b=hang,c=pass,d=fail,e=stubborn")
	dir := t.TempDir()
	c := runCmd{ginkgo: exe, e2e: "e2e.test", kubectl: "kubectl", out: dir, timeout: time.Hour, clientNice: 10,
		stall: time.Second, grace: 500 * time.Millisecond, pollEvery: 50 * time.Millisecond, seed: 4242}
	r := newResults(filepath.Join(dir, "progress.jsonl"))
	r.seed = c.seed
	planned := []string{"a", "b", "c", "d", "e"}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	rounds := []round{{name: "selection", focus: " [a-e]$", procs: 1, planned: planned}}
	c.runRounds(ctx, "kubeconfig", rounds, r)

	var sum strings.Builder
	failed, err := r.summary(&sum, filepath.Join(dir, "summary.txt"), time.Second, planned)
	if err != nil {
		t.Fatal(err)
	}
	if !failed {
		t.Error("a run with failures counts as passed")
	}
	got := sum.String()
	for _, want := range []string{
		"2 passed, 2 failed, 0 skipped, 1 not run",
		"NOT RUN e\n",
		"FAIL b\n       interrupted: Interrupted by User",
		"FAIL d\n       failed: it failed",
		"order of seed 4242 (-seed 4242 runs them",
	} {
		if !strings.Contains(got, want) {
			t.Errorf("summary lacks %q:\n%s", want, got)
		}
	}
	if r.interrupted["b"] != maxInterrupts {
		t.Errorf("b interrupted %d times, want %d", r.interrupted["b"], maxInterrupts)
	}
	if file, _ := os.ReadFile(filepath.Join(dir, "summary.txt")); string(file) != got {
		t.Errorf("summary.txt differs from the printed summary:\n%s", file)
	}
	// Every attempt keeps the run's order.
	// The same seed in every attempt; ginkgo (and the e2e.test processes
	// it forks) at the client's nice value, below the nodes under test.
	if seeds, _ := os.ReadFile(filepath.Join(dir, "seeds")); string(seeds) != strings.Repeat("--seed=4242 nice=10\n", 4) {
		t.Errorf("the attempts' seeds and nice values:\n%s\nwant --seed=4242 nice=10 in each of 4", seeds)
	}
	// Attempts: a b (interrupted) | b (interrupted again) | c d e (e
	// killed) | e (killed, nothing finished: the end).
	for i := 1; i <= 5; i++ {
		_, err := os.Stat(filepath.Join(dir, fmt.Sprintf("e2e-selection-%d.log", i)))
		if ran := err == nil; ran != (i <= 4) {
			t.Errorf("attempt %d ran: %v, want %v", i, ran, i <= 4)
		}
	}
	// What a certification submission checks: the attempts, the last log.
	if rounds[0].attempts != 4 || rounds[0].lastLog != filepath.Join(dir, "e2e-selection-4.log") {
		t.Errorf("the round records %d attempts, last log %s; want 4, e2e-selection-4.log", rounds[0].attempts, rounds[0].lastLog)
	}
}

// TestRoundsGinkgoDead: a ginkgo that exits at once, finishing nothing,
// ends the round with every spec not run (and the run failed).
func TestRoundsGinkgoDead(t *testing.T) {
	dir := t.TempDir()
	c := runCmd{ginkgo: "/bin/false", out: dir, timeout: time.Hour, stall: time.Minute, grace: time.Second, pollEvery: 50 * time.Millisecond}
	r := newResults(filepath.Join(dir, "progress.jsonl"))
	planned := []string{"a", "b"}
	c.runRounds(context.Background(), "kubeconfig", []round{{name: "selection", focus: ".", procs: 1, planned: planned}}, r)
	var sum strings.Builder
	failed, err := r.summary(&sum, filepath.Join(dir, "summary.txt"), time.Second, planned)
	if err != nil || !failed || !strings.Contains(sum.String(), "0 passed, 0 failed, 0 skipped, 2 not run") {
		t.Errorf("failed %v, %v:\n%s", failed, err, sum.String())
	}
}

// TestNamesFocus: the focus of a rerun matches the names given, whole,
// with their brackets and parentheses taken literally, and nothing else,
// in what ginkgo matches a focus against: the suite's description, a
// space, the spec's full name.
func TestNamesFocus(t *testing.T) {
	names := []string{"[sig-node] Pods should be (re)started [Conformance]", "[sig-apps] Job works"}
	re := regexp.MustCompile(e2especs.NamesFocus(names))
	const suite = suiteDescription + " "
	for _, n := range names {
		if !re.MatchString(suite + n) {
			t.Errorf("%q not matched", n)
		}
	}
	for _, n := range []string{"[sig-apps] Job works twice", "x[sig-apps] Job works", "[sig-node] Pods should be started [Conformance]"} {
		if re.MatchString(suite + n) {
			t.Errorf("%q matched", n)
		}
	}
}

// TestRoundsNodeLost: a node that stops being Ready while a spec runs
// (its power cut: the node lifecycle controller sets Ready Unknown)
// ends the attempt at once, the running spec interrupted with the node
// and its condition in its failure; the next attempt waits until the
// node is Ready again and runs what was left, and the run passes.
func TestRoundsNodeLost(t *testing.T) {
	c, r, dir, nodes := nodeRun(t, "a=pass,b=lost,c=pass", time.Minute)
	var out strings.Builder
	r.out = &out
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()

	cut := make(chan error, 1)
	go func() {
		// Once b runs, n2 loses its power; it is back a moment after b
		// was interrupted.
		wait := func(what string, done func() bool) error {
			for !done() {
				if ctx.Err() != nil {
					return fmt.Errorf("%s: %w", what, ctx.Err())
				}
				time.Sleep(10 * time.Millisecond)
			}
			return nil
		}
		if err := wait("b running", func() bool { _, err := os.Stat(filepath.Join(dir, "ran-b")); return err == nil }); err != nil {
			cut <- err
			return
		}
		setNodes(t, nodes, "n1=True:KubeletReady n2=Unknown:NodeStatusUnknown")
		if err := wait("b interrupted", func() bool {
			specs, _ := e2especs.ReadProgress(r.path)
			return slices.ContainsFunc(specs, func(s e2especs.Spec) bool { return s.Name == "b" && s.State == "interrupted" })
		}); err != nil {
			cut <- err
			return
		}
		time.Sleep(300 * time.Millisecond)
		setNodes(t, nodes, "n1=True:KubeletReady n2=True:KubeletReady")
		cut <- nil
	}()
	planned := []string{"a", "b", "c"}
	c.runRounds(ctx, "kubeconfig", []round{{name: "selection", focus: " [a-c]$", procs: 1, planned: planned}}, r)
	if err := <-cut; err != nil {
		t.Fatal(err)
	}

	var sum strings.Builder
	failed, err := r.summary(&sum, filepath.Join(dir, "summary.txt"), time.Second, planned)
	if err != nil {
		t.Fatal(err)
	}
	if failed || !strings.Contains(sum.String(), "3 passed, 0 failed, 0 skipped, 0 not run") {
		t.Errorf("failed %v:\n%s\nprogress:\n%s", failed, sum.String(), out.String())
	}
	const lost = "Interrupted by User (node n2 Ready=Unknown NodeStatusUnknown: message of NodeStatusUnknown)"
	if !strings.Contains(out.String(), "b\n          "+lost+"\n") {
		t.Errorf("progress lacks b interrupted with %q:\n%s", lost, out.String())
	}
	if r.interrupted["b"] != 1 {
		t.Errorf("b interrupted %d times, want 1", r.interrupted["b"])
	}
	// Each attempt counts its own specs from 1: the first finished a
	// and b (interrupted) of three, the second b and c of two.
	var counts []string
	for _, l := range strings.Split(out.String(), "\n") {
		if strings.HasPrefix(l, "[") {
			counts = append(counts, strings.Fields(l)[0])
		}
	}
	if want := []string{"[1/3]", "[2/3]", "[1/2]", "[2/2]"}; !slices.Equal(counts, want) {
		t.Errorf("progress counts %q, want %q:\n%s", counts, want, out.String())
	}
}

// TestRoundsNodeLeftBehind: a node that does not come back within
// -node-wait is left behind: the next attempt tells the suite that one
// node may be not Ready (else it would wait for it before its first
// spec), and the rest of the run passes.
func TestRoundsNodeLeftBehind(t *testing.T) {
	c, r, dir, nodes := nodeRun(t, "a=pass,b=lost", 300*time.Millisecond)
	r.out = io.Discard
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	go func() {
		for ctx.Err() == nil {
			if _, err := os.Stat(filepath.Join(dir, "ran-b")); err == nil {
				setNodes(t, nodes, "n1=True:KubeletReady n2=Unknown:NodeStatusUnknown")
				return
			}
			time.Sleep(10 * time.Millisecond)
		}
	}()
	planned := []string{"a", "b"}
	c.runRounds(ctx, "kubeconfig", []round{{name: "selection", focus: " [ab]$", procs: 1, planned: planned}}, r)
	var sum strings.Builder
	if failed, err := r.summary(&sum, filepath.Join(dir, "summary.txt"), time.Second, planned); err != nil || failed ||
		!strings.Contains(sum.String(), "2 passed, 0 failed") {
		t.Errorf("failed %v, %v:\n%s", failed, err, sum.String())
	}
	if c.leftBehind != 1 {
		t.Errorf("left behind %d nodes, want 1", c.leftBehind)
	}
}

// nodeRun is the runner of the lost-node tests: the test binary as
// ginkgo (running specs) and kubectl (two Ready nodes, n1 and n2, in the
// file nodes), the nodes looked at every 60 ms and waited for nodeWait.
func nodeRun(t *testing.T, specs string, nodeWait time.Duration) (c *runCmd, r *results, dir, nodes string) {
	exe, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	dir = t.TempDir()
	nodes = filepath.Join(dir, "nodes")
	setNodes(t, nodes, "n1=True:KubeletReady n2=True:KubeletReady")
	t.Setenv(fakeGinkgoEnv, specs)
	t.Setenv(fakeKubectlEnv, nodes)
	c = &runCmd{ginkgo: exe, kubectl: exe, e2e: "e2e.test", out: dir, timeout: time.Hour,
		stall: time.Minute, grace: time.Second, pollEvery: 20 * time.Millisecond,
		nodeEvery: 60 * time.Millisecond, nodeWait: nodeWait, clusterNodes: 2}
	return c, newResults(filepath.Join(dir, "progress.jsonl")), dir, nodes
}

// TestNodeLogsSaved: before the cluster goes, each node's logs are kept
// in a file of its own; a node that does not answer, or not in time, has
// why at the end of its file, and the nodes after it are still read.
func TestNodeLogsSaved(t *testing.T) {
	self, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	t.Setenv(fakePlinthctlEnv, "1")
	defer func(d time.Duration) { nodeLogsTimeout = d }(nodeLogsTimeout)
	nodeLogsTimeout = 5 * time.Second
	dir := t.TempDir()
	c := &runCmd{plinthctl: self}
	c.saveNodeLogs("/owner", []nodeRef{{"node0", "id0"}, {"node1", "dead"}, {"node2", "slow"}, {"node3", "id3"}}, dir)
	for name, want := range map[string]string{
		"node0": "id0 first line (owner /owner)\nid0 second line\n",
		"node1": "connection refused",
		"node2": "slow first line\nconformance: plinthctl node logs slow: no answer within 5s\n",
		"node3": "id3 first line (owner /owner)\nid3 second line\n",
	} {
		b, err := os.ReadFile(filepath.Join(dir, name+".log"))
		if err != nil {
			t.Errorf("%s: %v", name, err)
		} else if got := string(b); !strings.Contains(got, want) {
			t.Errorf("%s.log is %q, want it to hold %q", name, got, want)
		}
	}
}

// TestMetricsSaved: the API server's metrics and each node's kubelet's,
// through the node proxy, each in a file; a node that does not answer
// has the reason in its file.
func TestMetricsSaved(t *testing.T) {
	self, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	t.Setenv(fakeKubectlEnv, filepath.Join(t.TempDir(), "nodes"))
	dir := t.TempDir()
	c := &runCmd{kubectl: self}
	c.saveMetrics("kubeconfig", []nodeRef{{"node0", "id0"}, {"node1", "dead"}}, dir)
	for file, want := range map[string]string{
		"apiserver.metrics":     "metrics of /metrics\n",
		"node0.kubelet.metrics": "metrics of /api/v1/nodes/id0/proxy/metrics\n",
		"node1.kubelet.metrics": "kubectl get --raw /api/v1/nodes/dead/proxy/metrics: exit status 1",
	} {
		if b, err := os.ReadFile(filepath.Join(dir, file)); err != nil || !strings.Contains(string(b), want) {
			t.Errorf("%s: %q (%v), want it to hold %q", file, b, err, want)
		}
	}
}
