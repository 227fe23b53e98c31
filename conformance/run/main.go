// Command run is `make conformance`: the upstream Kubernetes conformance
// tests (out/bin/e2e.test, package conformance) against a two-node
// Plinth cluster in QEMU, offline.
//
//	dry run ──► the selected specs (count, names)
//	registry mirror of the images (registry.go) ──► launch 2 nodes (image with
//	  -conformance-images) ──► cluster policy: the mirror ──► kubeconfig ──► nodes Ready
//	ginkgo -procs N e2e.test -- --provider=local …   (round 1: the selection)
//	   │  every finished spec: one progress line (conformance/progress_test.go)
//	   │  no spec finished for -stall: interrupt; the next attempt runs the rest
//	   │  a node stops being Ready (nodes.go): interrupt, the node named in the
//	   │    running specs' failures; -node-wait for it, then the next attempt
//	   ▼
//	CONFORMANCE=serial: the [Serial] conformance specs, one at a time
//	summary (passed / failed / skipped, each failure's first line) ──► OUT/summary.txt
//	OUT/junit_01.xml (the suite's report), OUT/e2e-*.log
//	CONFORMANCE=certify: one round of every [Conformance] spec instead, and
//	  from a run that qualifies, OUT/submission/ (submission.go)
//	each node's logs ──► OUT/nodes/NAME.log, the API server's and kubelets'
//	  metrics ──► OUT/nodes/*.metrics (nodelogs.go); the cluster powered off
//
// Why a program and not a script: the cluster comes from the VM test
// harness (launch.LaunchCluster, as plinthctl launch), and it must be
// torn down whatever happens, the report still written.
package main

import (
	"context"
	"flag"
	"fmt"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"regexp"
	"syscall"
	"time"

	"plinth.dev/plinth/image"
	"plinth.dev/plinth/internal/testutil/e2especs"
	"plinth.dev/plinth/launch"
	"plinth.dev/plinth/platform/supervisor"
)

// The default selection: what conformance certification runs in
// parallel; the serial specs are CONFORMANCE=serial's second round.
const (
	defaultFocus = `\[Conformance\]`
	defaultSkip  = `\[Serial\]|\[Disruptive\]`
	serialFocus  = `\[Serial\].*\[Conformance\]|\[Conformance\].*\[Serial\]`
)

// conformanceMemoryMiB is each launched node's memory, twice the QEMU
// board's 2 GiB. The suite fills nodes with pods (the garbage
// collector's serial specs ask for 100, half of them on the controller),
// and pods cost their node memory outside their own cgroups too (their
// containerd shims: 100 pods on one node, 0.8 GiB in the pods' cgroups
// and 1.9 GiB in the node's system cgroup). On 2 GiB nodes 100 idle pods
// left the controller so little memory that its programs' pages were
// evicted and its controllers lost their leases; on 4 GiB nodes the
// replication controller reported them in a third of the time.
const conformanceMemoryMiB = 4096

type runCmd struct {
	image, out, e2e, ginkgo, kubectl, plinthctl string
	focus, skip                                 string
	serial, hold                                bool
	procs                                       int
	timeout, stall                              time.Duration
	grace, pollEvery                            time.Duration // after an interrupt, the kill; progress polls
	kubeconfig                                  string
	names                                       string        // file of spec names, one per line
	clusterNodes                                int           // nodes to launch, and to wait for
	controllerTaint                             bool          // the first node carries the control plane taint
	memoryMiB                                   int           // each node's memory
	nodeEvery, nodeWait                         time.Duration // looks at the nodes during an attempt; the wait for them after one interrupted for a node
	leftBehind                                  int           // nodes not Ready after that wait: the suite's --allowed-not-ready-nodes
	seed                                        int64         // ginkgo's random seed: the order of the specs
	certify                                     bool          // one round of every [Conformance] spec, then the submission
	product                                     string        // PRODUCT.yaml template of the submission
	verbose                                     bool          // ginkgo -v: every spec's output in the e2e log
	clientNice                                  int           // the nice value of ginkgo and its e2e.test processes
}

func main() {
	launch.MaybeProxy() // the registry's guest forwards run this program as their proxy
	c := runCmd{grace: 3 * time.Minute, pollEvery: 5 * time.Second, nodeEvery: 30 * time.Second}
	flag.StringVar(&c.image, "image", "out/image-conformance/qemu-x86_64", "node image built with plinthctl build --conformance-images")
	flag.StringVar(&c.out, "out", "out/conformance", "directory for the cluster, logs, the JUnit report and the summary")
	flag.StringVar(&c.e2e, "e2e", "out/bin/e2e.test", "the suite (make e2e)")
	flag.StringVar(&c.ginkgo, "ginkgo", "out/bin/ginkgo", "ginkgo CLI of go.mod's version (parallel runs)")
	flag.StringVar(&c.kubectl, "kubectl", "out/bin/kubectl", "kubectl of the nodes' Kubernetes version")
	flag.StringVar(&c.plinthctl, "plinthctl", "out/bin/plinthctl", "plinthctl (writes the kubeconfig)")
	flag.StringVar(&c.focus, "focus", defaultFocus, "regular expression: the specs to run (FOCUS=)")
	flag.StringVar(&c.skip, "skip", defaultSkip, "regular expression: the specs not to run (SKIP=)")
	flag.BoolVar(&c.serial, "serial", false, "then run the [Serial] conformance specs, one at a time (CONFORMANCE=serial)")
	flag.IntVar(&c.procs, "procs", 4, "ginkgo processes running specs side by side (the suite keeps [Serial] specs apart)")
	flag.DurationVar(&c.timeout, "timeout", 3*time.Hour, "bound of each round")
	flag.DurationVar(&c.stall, "stall", 25*time.Minute, "interrupt a round when no spec finished for this long (a hung spec); the next round runs the specs left")
	flag.StringVar(&c.kubeconfig, "kubeconfig", "", "run against this running cluster instead of launching one")
	flag.StringVar(&c.names, "names", "", "run the specs named in `FILE`, one full name per line (as the progress lines and summary print them; lines beginning with # are comments), instead of -focus and -skip")
	flag.IntVar(&c.clusterNodes, "nodes", 2, "nodes to launch (the first a controller and worker, the others workers)")
	flag.BoolVar(&c.controllerTaint, "controller-taint", false, "put the control plane taint on the first node (plinthctl role taint), as on a production controller: the suite's pods run on the other nodes, while the controller keeps its kubelet and pod network (the API server reaches pods)")
	flag.DurationVar(&c.nodeWait, "node-wait", 10*time.Minute, "after a node stopped being Ready during a round (its specs interrupted), wait this long for it before the round goes on")
	flag.BoolVar(&c.hold, "hold", false, "keep the launched cluster running after the summary, until interrupted (to look into a failure, or run more against it with -kubeconfig)")
	flag.IntVar(&c.memoryMiB, "memory", conformanceMemoryMiB, "each launched node's memory in MiB")
	flag.BoolVar(&c.certify, "certify", false, "run every [Conformance] spec once, nothing skipped (the serial ones last), and write a certification submission from a run that qualifies (CONFORMANCE=certify; not with -focus, -skip, -names or -serial)")
	flag.StringVar(&c.product, "product", "conformance/PRODUCT.yaml", "the submission's PRODUCT.yaml, its version set from the image")
	flag.IntVar(&c.clientNice, "client-nice", 10, "nice value of ginkgo and the e2e.test processes: the suite's client takes the host CPU the nodes' QEMU processes leave, as on a machine of its own")
	flag.Int64Var(&c.seed, "seed", 0, "ginkgo's random seed, which orders the specs (0: a new one; the summary prints it, and -seed N with any selection runs the specs it shares with that run in the same order, to replay a failure that depends on the spec before)")
	flag.Parse()
	if flag.NArg() > 0 {
		fmt.Fprintf(os.Stderr, "conformance: unexpected arguments %q\n", flag.Args())
		os.Exit(2)
	}
	if c.certify {
		flag.Visit(func(f *flag.Flag) {
			switch f.Name {
			case "focus", "skip", "names", "serial":
				fmt.Fprintf(os.Stderr, "conformance: -certify runs every [Conformance] spec: not with -%s\n", f.Name)
				os.Exit(2)
			}
		})
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	failed, err := c.run(ctx)
	if err != nil {
		fmt.Fprintln(os.Stderr, "conformance:", err)
		os.Exit(1)
	}
	if failed {
		os.Exit(1)
	}
}

func (c *runCmd) run(ctx context.Context) (failed bool, err error) {
	for _, p := range []*string{&c.image, &c.out, &c.e2e, &c.ginkgo, &c.kubectl, &c.plinthctl, &c.product} {
		if *p, err = filepath.Abs(*p); err != nil {
			return false, err
		}
	}
	for _, f := range []struct{ p, make string }{{c.e2e, "make e2e"}, {c.ginkgo, "make e2e"}, {c.kubectl, "make image"}, {c.plinthctl, "make image"}} {
		if _, err := os.Stat(f.p); err != nil {
			return false, fmt.Errorf("%w (%s builds it)", err, f.make)
		}
	}
	if c.names != "" {
		names, err := e2especs.ReadNames(c.names)
		if err != nil {
			return false, err
		}
		c.focus, c.skip = e2especs.NamesFocus(names), ""
	}
	for _, re := range []string{c.focus, c.skip} {
		if _, err := regexp.Compile(re); err != nil {
			return false, fmt.Errorf("FOCUS/SKIP %q: %w", re, err)
		}
	}
	if err := os.MkdirAll(c.out, 0o755); err != nil {
		return false, err
	}
	if c.seed == 0 {
		c.seed = 1 + time.Now().UnixNano()%1_000_000_000
	}
	start := time.Now()
	rounds := []round{{name: "selection", focus: c.focus, skip: c.skip, procs: c.procs}}
	if c.serial {
		rounds = append(rounds, round{name: "serial", focus: serialFocus, procs: 1})
	}
	if c.certify {
		// ginkgo runs the [Serial] specs after the others, one at a time.
		rounds = []round{{name: "certification", focus: certifyFocus, procs: c.procs}}
		c.verbose = true
	}
	for i, r := range rounds {
		names, err := c.dryRun(ctx, r.focus, r.skip)
		if err != nil {
			return false, err
		}
		fmt.Printf("conformance: %s: %d specs\n", r.name, len(names))
		rounds[i].planned = names
	}

	kubeconfig := c.kubeconfig
	if kubeconfig == "" {
		stop, kc, err := c.launch(ctx)
		if stop != nil {
			defer func() {
				fmt.Println("conformance: powering the cluster off")
				stop()
			}()
		}
		if err != nil {
			return false, err
		}
		kubeconfig = kc
	}
	if _, err := c.waitNodes(ctx, kubeconfig, 15*time.Minute); err != nil {
		return false, err
	}

	results := newResults(filepath.Join(c.out, "progress.jsonl"))
	results.seed = c.seed
	c.runRounds(ctx, kubeconfig, rounds, results)
	var planned []string
	for _, r := range rounds {
		planned = append(planned, r.planned...)
	}
	failed, err = results.summary(os.Stdout, filepath.Join(c.out, "summary.txt"), time.Since(start), planned)
	if c.certify && err == nil {
		c.submit(rounds[0], results)
	}
	if c.hold && c.kubeconfig == "" {
		fmt.Printf("conformance: -hold: the cluster stays up (KUBECONFIG=%s PLINTH_CONFIG=%s); Ctrl-C powers it off\n",
			kubeconfig, filepath.Join(c.out, "cluster", "owner"))
		<-ctx.Done()
	}
	return failed, err
}

// A round is one selection of specs (the default one, the serial one),
// run by ginkgo until every planned spec has finished.
type round struct {
	name, focus, skip string
	procs             int
	planned           []string // the names the dry run listed
	attempts          int      // ginkgo runs it took
	lastLog           string   // the last attempt's e2e log
}

// runRounds runs each round in attempts: the first runs the selection;
// when an attempt ends with specs unfinished (ginkgo interrupted for a
// stall or a node lost, or dead), the next runs those by name, after an
// attempt that lost a node once the nodes are Ready again (or
// c.nodeWait has passed). A spec interrupted twice
// stays failed (it hangs: results.missing), and an attempt that finishes
// nothing ends the round, so a run always ends.
func (c *runCmd) runRounds(ctx context.Context, kubeconfig string, rounds []round, results *results) {
	for i := range rounds {
		r := &rounds[i]
		left := r.planned
		for attempt := 1; len(left) > 0 && ctx.Err() == nil; attempt++ {
			focus, skip := r.focus, r.skip
			if attempt > 1 {
				// The specs an attempt did not finish, by name.
				focus, skip = e2especs.NamesFocus(left), ""
			}
			log := filepath.Join(c.out, fmt.Sprintf("e2e-%s-%d.log", r.name, attempt))
			r.attempts, r.lastLog = attempt, log
			fmt.Printf("conformance: %s, attempt %d: %d specs, %d at a time (log %s)\n", r.name, attempt, len(left), r.procs, log)
			finished, nodeLost, err := c.ginkgoRun(ctx, kubeconfig, focus, skip, r.procs, log, results, len(left))
			left = results.missing(left)
			if finished == 0 && len(left) > 0 {
				fmt.Printf("conformance: %s: ginkgo: %v; no spec finished, %d left unrun\n", r.name, err, len(left))
				break
			}
			if nodeLost && len(left) > 0 {
				fmt.Printf("conformance: %s: waiting up to %v for every node to be Ready\n", r.name, c.nodeWait)
				// The suite waits for every node before its first spec
				// (up to 30 minutes) unless told how many may be missing.
				n, err := c.waitNodes(ctx, kubeconfig, c.nodeWait)
				if err != nil {
					fmt.Printf("conformance: %s: %v; going on without %d (--allowed-not-ready-nodes)\n", r.name, err, n)
				}
				c.leftBehind = n
			}
		}
	}
}

// launch starts the registry mirror and the cluster and writes its
// kubeconfig; stop, if not nil, powers the cluster off and stops the
// registry.
func (c *runCmd) launch(ctx context.Context) (stop func(), kubeconfig string, err error) {
	img, err := launch.LoadImage(c.image)
	if err != nil {
		return nil, "", fmt.Errorf("%w (make conformance builds the image with -conformance-images)", err)
	}
	if c.memoryMiB > 0 {
		img.Board.QEMU.MemoryMiB = c.memoryMiB
	}
	dir := filepath.Join(c.out, "cluster")
	if err := os.RemoveAll(dir); err != nil {
		return nil, "", err
	}
	reg, hosts, err := startMirror(filepath.Join(c.image, image.ConformanceArchive), c.out)
	if err != nil {
		return nil, "", err
	}
	fmt.Printf("conformance: launching %d nodes of %d MiB from %s (minutes under TCG)\n", c.clusterNodes, img.Board.QEMU.MemoryMiB, c.image)
	cl, err := launch.LaunchCluster(ctx, launch.ClusterOptions{Nodes: c.clusterNodes, Image: img, Dir: dir, Progress: os.Stdout,
		DiskSizeBytes: 8 << 30, Kubernetes: true, Registry: reg})
	if err != nil {
		reg.Close()
		return nil, "", err
	}
	stop = func() {
		var nodes []nodeRef
		for _, n := range cl.Nodes() {
			nodes = append(nodes, nodeRef{name: n.Name, id: n.ID()})
		}
		c.saveMetrics(filepath.Join(dir, "kubeconfig"), nodes, filepath.Join(c.out, "nodes"))
		c.saveNodeLogs(cl.OwnerDir(), nodes, filepath.Join(c.out, "nodes"))
		cl.Close()
		reg.Close()
	}
	if err := c.mirrorPolicy(ctx, cl, reg, hosts); err != nil {
		return stop, "", err
	}
	kc := filepath.Join(dir, "kubeconfig")
	cmd := exec.CommandContext(ctx, c.plinthctl, "cluster", "kubeconfig", "--server", "https://"+cl.KubernetesAPIEndpoint(cl.Nodes()[0]),
		"--wait", "10m", "--file", kc)
	cmd.Env = append(os.Environ(), "PLINTH_CONFIG="+cl.OwnerDir())
	if out, err := cmd.CombinedOutput(); err != nil {
		return stop, "", fmt.Errorf("plinthctl cluster kubeconfig: %v: %s", err, out)
	}
	if c.controllerTaint {
		if err := c.taintController(ctx, cl); err != nil {
			return stop, "", err
		}
	}
	return stop, kc, nil
}

// taintController puts the control plane taint on the cluster's first
// node (taintNode).
func (c *runCmd) taintController(ctx context.Context, cl *launch.Cluster) error {
	n := cl.Nodes()[0]
	if err := c.taintNode(ctx, n.ID(), cl.KubernetesAPIEndpoint(n), cl.OwnerDir(), 5*time.Second, 10*time.Minute); err != nil {
		return err
	}
	fmt.Printf("conformance: %s carries the control plane taint\n", n.Name)
	return nil
}

// taintNode runs the owner's `plinthctl role taint id` against the API
// server at server, every retry until it succeeds or wait has passed:
// the node's kubelet registers its Node object some time after the
// cluster is up, and until then there is nothing to taint.
func (c *runCmd) taintNode(ctx context.Context, id, server, ownerDir string, retry, wait time.Duration) error {
	deadline := time.Now().Add(wait)
	for {
		cmd := exec.CommandContext(ctx, c.plinthctl, "role", "taint", id, "--kube-server", server)
		cmd.Env = append(os.Environ(), "PLINTH_CONFIG="+ownerDir)
		out, err := cmd.CombinedOutput()
		if err == nil {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("plinthctl role taint %s: %v: %s", id, err, out)
		}
		if supervisor.Sleep(ctx, retry) != nil {
			return ctx.Err()
		}
	}
}
