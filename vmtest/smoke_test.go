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
)

// The conformance smoke: the upstream [Conformance] specs named in
// conformance/smoke.txt (pods, services, DNS, ConfigMaps and Secrets,
// service accounts, authorization), run by ginkgo over e2e.test (make
// e2e) against TestKubernetesTwoNodes' cluster while the test goes on
// with its own checks, so it costs no boot of its own:
//
//	pushConformanceImages ──► the harness's registry (registry.k8s.io's mirror in the policy)
//	startSmoke: ginkgo run --procs 3 e2e.test ──► OUT/vmtest/TestKubernetesTwoNodes/smoke/
//	  …the test's own checks…
//	wait: every named spec passed (progress.jsonl), or the failures and the log's tail
//
// The images are the ones `make conformance` carries in its image
// (image.ConformanceImages), served by the registry instead: the nodes
// pull them as they would from an offline cluster's mirror.

// smokeTimeout bounds the smoke's ginkgo run.
const smokeTimeout = 15 * time.Minute

// pushConformanceImages builds the conformance images (image.
// ConformanceOCIImages, from make e2e's out/bin/conformance) and pushes
// each to reg under its reference's repository and tag.
func pushConformanceImages(t *testing.T, reg *Registry) {
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

// startSmoke starts the smoke against the cluster of kubeconfig, its
// report in dir/smoke. The returned wait waits for it to end and fails
// the test unless every named spec passed.
func startSmoke(t *testing.T, ctx context.Context, dir, kubeconfig, kubectl string) (wait func()) {
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
	args := []string{"run", "--no-color", "--procs=3", "--timeout=" + smokeTimeout.String(),
		"--focus=" + e2especs.NamesFocus(names), e2e, "--"}
	cmd := exec.Command(ginkgo, append(args, e2especs.SuiteFlags(kubeconfig, kubectl, out)...)...)
	cmd.Env = append(os.Environ(), e2especs.ProgressEnv+"="+progress)
	cmd.Stdout, cmd.Stderr = log, log
	// Its own process group: ginkgo's parallel processes end with it.
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if err := cmd.Start(); err != nil {
		log.Close()
		t.Fatalf("%v (make e2e builds ginkgo and e2e.test)", err)
	}
	start := time.Now()
	t.Logf("conformance smoke: %d specs of conformance/smoke.txt started (ginkgo, 3 processes; log %s)", len(names), logPath)
	// The run's end, for the report: the wait below may come later.
	var took time.Duration
	done := make(chan error, 1)
	go func() {
		err := cmd.Wait()
		took = time.Since(start)
		log.Close()
		done <- err
	}()
	kill := func() { syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL) }
	t.Cleanup(kill)
	return func() {
		t.Helper()
		checks := time.Since(start)
		var runErr error
		select {
		case runErr = <-done:
		case <-ctx.Done():
			kill()
			runErr = <-done
		}
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
		t.Logf("conformance smoke: %d of %d specs passed in %v (the test's own checks took %v)", passed, len(names),
			took.Round(time.Second), checks.Round(time.Second))
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
}
