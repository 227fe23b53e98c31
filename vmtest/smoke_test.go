//go:build built

package vmtest

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/google/go-containerregistry/pkg/name"

	"plinth.dev/plinth/image"
	"plinth.dev/plinth/internal/testutil/e2especs"
	"plinth.dev/plinth/launch"
)

// The conformance smoke: the upstream [Conformance] specs named in
// conformance/smoke.txt (pods, services, DNS, ConfigMaps and Secrets,
// service accounts, authorization), run by ginkgo over e2e.test (make
// e2e) against TestKubernetesTwoNodes' cluster, so it costs no boot of
// its own:
//
//	pushConformanceImages ──► the harness's registry (registry.k8s.io's mirror in the policy)
//	prepullSmokeImages (once the API server answers): DaemonSet of smokeImages ──► each node pulls them when Ready
//	smokeImagesPulled: its pods run on both nodes; DaemonSet deleted
//	runSmoke: ginkgo run --procs 3 e2e.test ──► OUT/vmtest/TestKubernetesTwoNodes/smoke/
//	  every named spec passed (progress.jsonl), or the failures and the log's tail
//	…then the test's own workloads and checks
//
// The images are the ones `make conformance` carries in its image
// (image.ConformanceImages), served by the registry instead: the nodes
// pull them as they would from an offline cluster's mirror. They are
// pulled before the specs run, as upstream's --prepull-images does (whose
// list names images no conformance spec uses, which the registry does not
// serve): a spec waits five minutes for its pod, pull included.
//
// The smoke runs alone, before the test's workloads: beside them and the
// checks, the two TCG nodes have more to do than the host's two cores
// (pods take minutes to start, a trivial GET seconds), and the smoke
// takes twice as long or does not finish.

// smokeTimeout bounds the smoke's ginkgo run.
const smokeTimeout = 15 * time.Minute

// smokeSeed orders the smoke's specs (ginkgo's --seed; processes take
// the next spec in that order): with it the two Job specs, the longest
// (a Job's pods started, failed or evicted, and replaced, one after
// another), come first, and the short ones fill in beside them; in a
// random order they could start last and the smoke wait for them alone.
// Found by dry runs (e2e.test --ginkgo.dry-run --ginkgo.seed=N
// --ginkgo.focus=… -ginkgo.v) of this suite and conformance/smoke.txt;
// another Kubernetes version or smoke list may want another.
const smokeSeed = 29

// pushConformanceImages builds the conformance images (image.
// ConformanceOCIImages, from make e2e's out/bin/conformance) and pushes
// each to reg under its reference's repository and tag.
func pushConformanceImages(t *testing.T, reg *launch.Registry) {
	t.Helper()
	dir := builtPath(t, "PLINTH_CONFORMANCE_BIN", "bin/conformance")
	images, err := image.ConformanceOCIImages(image.ConformanceInputs{Dir: dir}, testpodProgram(t), runtime.GOARCH)
	if err != nil {
		t.Fatalf("%v (make e2e builds them)", err)
	}
	for ref, img := range images {
		tag, err := name.NewTag(ref, name.StrictValidation)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := reg.Push(tag.RepositoryStr(), tag.TagStr(), img); err != nil {
			t.Fatalf("pushing %s: %v", ref, err)
		}
	}
}

// smokeImages are the conformance images the smoke's specs run (the
// harness registry's log, registry.log, shows what the nodes pull).
var smokeImages = []string{
	"registry.k8s.io/e2e-test-images/agnhost:2.66.1",
	"registry.k8s.io/e2e-test-images/busybox:1.37.0-2",
	"registry.k8s.io/e2e-test-images/nginx:1.27.0-2",
}

// smokePrepullNamespace holds the DaemonSet that pulls smokeImages.
const smokePrepullNamespace = "smoke-images"

// prepullSmokeImages applies a DaemonSet whose pods run every image of
// smokeImages (each image has busybox's sleep), so that each node pulls
// them as soon as it is Ready; smokeImagesPulled waits for them.
func prepullSmokeImages(t *testing.T, ctx context.Context, k kubectl) {
	t.Helper()
	var containers strings.Builder
	for i, img := range smokeImages {
		fmt.Fprintf(&containers, "      - {name: c%d, image: %q, command: [sleep, \"86400\"]}\n", i, img)
	}
	k.apply(t, ctx, `apiVersion: v1
kind: Namespace
metadata: {name: `+smokePrepullNamespace+`}
---
apiVersion: apps/v1
kind: DaemonSet
metadata: {name: images, namespace: `+smokePrepullNamespace+`}
spec:
  selector: {matchLabels: {app: smoke-images}}
  template:
    metadata: {labels: {app: smoke-images}}
    spec:
      terminationGracePeriodSeconds: 0
      containers:
`+containers.String())
}

// smokeImagesPulled waits until the DaemonSet of prepullSmokeImages runs
// a pod on each of nodes nodes, then deletes it (the images stay).
func smokeImagesPulled(t *testing.T, ctx context.Context, k kubectl, nodes int) {
	t.Helper()
	k.untilExplained(t, ctx, smokePrepullTimeout, fmt.Sprintf("the smoke's images on all %d nodes", nodes),
		func(out string) bool { return strings.TrimSpace(out) == fmt.Sprint(nodes) },
		func() string {
			pods, _ := k.try(ctx, "get", "pods", "-n", smokePrepullNamespace, "-o", "wide")
			events, _ := k.try(ctx, "get", "events", "-n", smokePrepullNamespace)
			return pods + "\n" + events
		},
		"get", "daemonset", "-n", smokePrepullNamespace, "images", "-o", "jsonpath={.status.numberAvailable}")
	k.run(t, ctx, "delete", "namespace", smokePrepullNamespace, "--wait=false")
}

// smokePrepullTimeout bounds the wait for the smoke's images.
const smokePrepullTimeout = 10 * time.Minute

// runSmoke runs the smoke against the cluster of k, its report in
// dir/smoke, and fails the test unless every named spec passed.
func runSmoke(t *testing.T, ctx context.Context, dir string, k kubectl) {
	t.Helper()
	e2e, ginkgo := builtPath(t, "PLINTH_E2E_TEST", "bin/e2e.test"), builtPath(t, "PLINTH_GINKGO", "bin/ginkgo")
	names, err := e2especs.ReadNames(filepath.Join("..", "conformance", "smoke.txt"))
	if err != nil {
		t.Fatal(err)
	}
	out := filepath.Join(dir, "smoke")
	if err := os.MkdirAll(out, 0o755); err != nil {
		t.Fatal(err)
	}
	progress, logPath := filepath.Join(out, "progress.jsonl"), filepath.Join(out, "ginkgo.log")
	log, err := os.Create(logPath)
	if err != nil {
		t.Fatal(err)
	}
	// -v: every spec's output and the suite's setup in the log, as a
	// certification run's (conformance/run -certify) must have them.
	args := []string{"run", "--no-color", "-v", "--procs=3", "--timeout=" + smokeTimeout.String(), fmt.Sprintf("--seed=%d", smokeSeed),
		"--focus=" + e2especs.NamesFocus(names), e2e, "--"}
	cmd := exec.CommandContext(ctx, ginkgo, append(args, e2especs.SuiteFlags(k.kubeconfig, k.bin, out)...)...)
	cmd.Env = append(os.Environ(), e2especs.ProgressEnv+"="+progress)
	cmd.Stdout, cmd.Stderr = log, log
	// Its own process group, killed whole: ginkgo's parallel processes
	// end with it.
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	cmd.Cancel = func() error { return syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL) }
	t.Logf("conformance smoke: %d specs of conformance/smoke.txt (ginkgo, 3 processes; log %s)", len(names), logPath)
	start := time.Now()
	runErr := cmd.Run()
	log.Close()
	specs, err := e2especs.ReadProgress(progress)
	if err != nil && !os.IsNotExist(err) {
		t.Errorf("conformance smoke: %v", err)
	}
	var failed []string
	passed := 0
	for _, s := range specs {
		if s.Outcome() == "passed" {
			passed++
		} else {
			failed = append(failed, fmt.Sprintf("%s %s: %s", s.State, s.Name, s.Failure))
		}
	}
	for _, n := range names {
		if !slices.ContainsFunc(specs, func(s e2especs.Spec) bool { return s.Name == n }) {
			failed = append(failed, "not run: "+n)
		}
	}
	t.Logf("conformance smoke: %d of %d specs passed in %v", passed, len(names), time.Since(start).Round(time.Second))
	// The line a certification submission's log is checked for.
	if v, _, err := e2especs.SuiteVersion(logPath); err != nil || !strings.HasPrefix(v, "v1.") {
		t.Errorf("conformance smoke: the suite's version in its log: %q, %v", v, err)
	}
	if len(failed) > 0 || runErr != nil {
		b, _ := os.ReadFile(logPath)
		var events []string // the failed specs' namespaces' events (e2especs.SuiteFlags)
		for _, l := range strings.Split(string(b), "\n") {
			if strings.Contains(l, " - event for ") {
				events = append(events, strings.TrimSpace(l))
			}
		}
		t.Errorf("conformance smoke: ginkgo: %v; %d failed:\n%s\ntheir events:\n%s\nthe log's tail:\n%s", runErr, len(failed),
			strings.Join(failed, "\n"), strings.Join(events[max(0, len(events)-30):], "\n"),
			strings.Join(lastLines(string(b), 15), "\n"))
	}
}
