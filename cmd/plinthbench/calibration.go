package main

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"io"
	"maps"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"time"

	"plinth.dev/plinth/launch"
	"plinth.dev/plinth/platform/layout"
	"plinth.dev/plinth/roleserver/kubernetes"
	"plinth.dev/plinth/roleserver/kubernetes/pki"
)

// calibration is this run's yardstick for the Kubernetes figures: the
// image's own `kube apiserver` alone with a plain embedded etcd on
// tmpfs, booted as a bare initramfs (launch/calibinit as /init) on the
// image's kernel in a node's VM shape, timed to its first /readyz 200.
// The kubernetes section divides its start figures by it: the machine's
// speed (TCG, load) moves both, the ratio is Plinth's own cost. Zero
// means not measured.
type calibration struct {
	wall  float64 // launch to the console line
	guest float64 // guest uptime at the first /readyz 200
}

// calibrationLine is what calibinit prints (launch/calibinit): uptimes
// in seconds, memory in MiB; zero where the line does not say.
type calibrationLine struct {
	with               string // the policies it ran with ("plain", "admission+audit")
	exec, ready        float64
	init, etcd         float64
	apiRSSMiB, initRSS float64
	apiCPU, initCPU    float64 // CPU seconds at ready
}

// calibrationRE matches calibinit's result or failure line.
var calibrationRE = regexp.MustCompile(`calibration: (?:exec at|failed:).*`)

var (
	calibResultRE = regexp.MustCompile(`calibration: exec at ([0-9.]+) s, ready at ([0-9.]+) s uptime`)
	calibFailedRE = regexp.MustCompile(`calibration: failed: (.*)`)
	calibExtraRE  = map[string]*regexp.Regexp{
		"with":    regexp.MustCompile(`\(with ([A-Za-z0-9+=]+),`),
		"init":    regexp.MustCompile(`\binit ([0-9.]+) s\b`),
		"etcd":    regexp.MustCompile(`\betcd ready ([0-9.]+) s\b`),
		"apiRSS":  regexp.MustCompile(`\bapiserver peak rss ([0-9.]+) MiB\b`),
		"initRSS": regexp.MustCompile(`\binit peak rss ([0-9.]+) MiB\b`),
		"apiCPU":  regexp.MustCompile(`\bapiserver cpu ([0-9.]+) s\b`),
		"initCPU": regexp.MustCompile(`\binit cpu ([0-9.]+) s\b`),
	}
)

// parseCalibrationLine reads calibinit's console line.
func parseCalibrationLine(line string) (calibrationLine, error) {
	if m := calibFailedRE.FindStringSubmatch(line); m != nil {
		return calibrationLine{}, fmt.Errorf("calibration failed in the guest: %s", strings.TrimSpace(m[1]))
	}
	m := calibResultRE.FindStringSubmatchIndex(line)
	if m == nil {
		return calibrationLine{}, fmt.Errorf("not a calibration line: %q", line)
	}
	var l calibrationLine
	var err error
	if l.exec, err = strconv.ParseFloat(line[m[2]:m[3]], 64); err != nil {
		return calibrationLine{}, fmt.Errorf("calibration line %q: exec: %w", line, err)
	}
	if l.ready, err = strconv.ParseFloat(line[m[4]:m[5]], 64); err != nil {
		return calibrationLine{}, fmt.Errorf("calibration line %q: ready: %w", line, err)
	}
	if l.ready < l.exec {
		return calibrationLine{}, fmt.Errorf("calibration line %q: ready before exec", line)
	}
	rest := line[m[1]:]
	if x := calibExtraRE["with"].FindStringSubmatch(rest); x != nil {
		l.with = x[1]
	}
	for k, p := range map[string]*float64{"init": &l.init, "etcd": &l.etcd, "apiRSS": &l.apiRSSMiB, "initRSS": &l.initRSS, "apiCPU": &l.apiCPU, "initCPU": &l.initCPU} {
		if x := calibExtraRE[k].FindStringSubmatch(rest); x != nil {
			*p, _ = strconv.ParseFloat(x[1], 64)
		}
	}
	return l, nil
}

// calibrationPolicyDir is where the calibration's initramfs holds the
// Plinth API server policies' files (calibinit reads KIND.args there).
const calibrationPolicyDir = "/etc/calibration"

// benchCalibration builds the calibration's initramfs (calibinit, the
// image's kube binary from binDir, /etc/hosts, and Plinth's API server
// policies: kubernetes.APIServerPolicies), boots it rounds times per
// variant, interleaved, and reports the medians. The variant "plain" is
// the yardstick (returned); the others ("admission", "audit+encryption",
// ...) start the same API server with those of Plinth's policies, each
// also as a ratio to plain: what they cost the start alone.
func benchCalibration(ctx context.Context, img *launch.Image, binDir, work string, variants []string, rounds int, add addFunc) (calibration, error) {
	kube := filepath.Join(binDir, "kube")
	if err := sameAsImage(img, kube, layout.KubeBinary); err != nil {
		return calibration{}, err
	}
	if !slices.Contains(variants, "plain") {
		variants = append([]string{"plain"}, variants...)
	}
	dir := filepath.Join(work, "calibration")
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return calibration{}, err
	}
	initBin := filepath.Join(dir, "init")
	cmd := exec.Command("go", "build", "-trimpath", "-ldflags=-s -w", "-o", initBin, "./launch/calibinit")
	cmd.Env = append(os.Environ(), "CGO_ENABLED=0")
	if msg, err := cmd.CombinedOutput(); err != nil {
		return calibration{}, fmt.Errorf("building calibinit: %v: %s", err, msg)
	}
	files, err := calibrationPolicyFiles()
	if err != nil {
		return calibration{}, err
	}
	// Uncompressed: gunzip of the 150 MB kube binary costs seconds of
	// guest time under TCG, before /init even starts.
	initramfs := filepath.Join(dir, "initramfs.cpio")
	if err := launch.BuildInitramfs(initBin, initramfs, false, append([]launch.InitramfsFile{
		{Name: "kube", Mode: 0o755, Source: kube},
		{Name: "etc/hosts", Data: []byte("127.0.0.1 localhost\n::1 localhost\n")},
	}, files...)...); err != nil {
		return calibration{}, err
	}
	runs := map[string][]calibrationRun{}
	for r := range rounds {
		for _, v := range variants {
			fmt.Fprintf(os.Stderr, "calibration: booting kube apiserver + etcd alone (%s, %d of %d)\n", v, r+1, rounds)
			run, err := calibrationBoot(ctx, img, initramfs, filepath.Join(dir, fmt.Sprintf("vm-%s-%d", strings.ReplaceAll(v, "+", "_"), r)), v)
			if err != nil {
				return calibration{}, fmt.Errorf("%s: %w", v, err)
			}
			fmt.Fprintf(os.Stderr, "calibration: %s: exec → /readyz 200 in %.2f s (API server CPU %.2f s), ready at %.2f s uptime\n",
				v, run.line.ready-run.line.exec, run.line.apiCPU, run.line.ready)
			runs[v] = append(runs[v], run)
		}
	}
	accel := accelName()
	plain := runs["plain"]
	c := calibration{wall: medianOf(plain, func(r calibrationRun) float64 { return r.wall }), guest: medianOf(plain, func(r calibrationRun) float64 { return r.line.ready })}
	of := fmt.Sprintf(" (median of %d)", len(plain))
	add("calibration_apiserver_ready_wall_seconds", c.wall, "s", accel+", launch to the first /readyz 200 of kube apiserver alone (embedded etcd on tmpfs, bare initramfs, image's kernel)"+of)
	add("calibration_apiserver_ready_guest_seconds", c.guest, "s", "guest uptime at that 200")
	afterExec := func(r calibrationRun) float64 { return r.line.ready - r.line.exec }
	add("calibration_apiserver_ready_after_exec_seconds", medianOf(plain, afterExec), "s", "its exec to that 200")
	if l := plain[0].line; l.init > 0 {
		add("calibration_init_guest_seconds", medianOf(plain, func(r calibrationRun) float64 { return r.line.init }), "s", "guest uptime at /init (kernel + unpacking the uncompressed initramfs)")
	}
	add("calibration_apiserver_exec_guest_seconds", medianOf(plain, func(r calibrationRun) float64 { return r.line.exec }), "s", "guest uptime at the exec (after certificates and etcd ready)")
	if l := plain[0].line; l.apiRSSMiB > 0 {
		add("calibration_apiserver_peak_rss_mib", medianOf(plain, func(r calibrationRun) float64 { return r.line.apiRSSMiB }), "MiB", "peak resident memory (VmHWM) of kube apiserver at ready")
	}
	if l := plain[0].line; l.initRSS > 0 {
		add("calibration_init_etcd_peak_rss_mib", medianOf(plain, func(r calibrationRun) float64 { return r.line.initRSS }), "MiB", "peak resident memory of /init with the embedded etcd at ready")
	}
	if l := plain[0].line; l.apiCPU > 0 {
		add("calibration_apiserver_cpu_seconds", medianOf(plain, func(r calibrationRun) float64 { return r.line.apiCPU }), "s", "CPU time of kube apiserver at that 200")
		add("calibration_init_etcd_cpu_seconds", medianOf(plain, func(r calibrationRun) float64 { return r.line.initCPU }), "s", "CPU time of /init with the embedded etcd at that 200")
	}
	base := medianOf(plain, afterExec)
	for _, v := range variants {
		if v == "plain" {
			continue
		}
		name := "calibration_with_" + strings.ReplaceAll(v, "+", "_")
		x := medianOf(runs[v], afterExec)
		add(name+"_after_exec_seconds", x, "s", "the same API server with Plinth's "+v+" policy: exec to the first /readyz 200"+of)
		add(name+"_after_exec_ratio", x/base, "x", "that / plain's exec to /readyz 200")
		if runs[v][0].line.apiCPU > 0 {
			add(name+"_apiserver_cpu_seconds", medianOf(runs[v], func(r calibrationRun) float64 { return r.line.apiCPU }), "s", "its CPU time at that 200")
		}
	}
	return c, nil
}

// calibrationRun is one boot's wall time (launch to the console line)
// and its line.
type calibrationRun struct {
	wall float64
	line calibrationLine
}

// calibrationBoot boots the calibration's initramfs once, with the
// policies of variant ("plain" or KIND+KIND...) or its environment
// variable (NAME=VALUE).
func calibrationBoot(ctx context.Context, img *launch.Image, initramfs, workDir, variant string) (calibrationRun, error) {
	o := img.NodeOptions("calibration")
	o.Initramfs, o.Cmdline = initramfs, calibrationCmdline(o.Cmdline)
	if strings.Contains(variant, "=") {
		o.Cmdline += " calibration.env=" + variant
	} else if variant != "plain" {
		o.Cmdline += " calibration.with=" + strings.ReplaceAll(variant, "+", ",")
	}
	o.NoTPM = true
	o.WorkDir = workDir
	if err := os.MkdirAll(o.WorkDir, 0o755); err != nil {
		return calibrationRun{}, err
	}
	ctx, cancel := context.WithTimeout(ctx, 20*time.Minute)
	defer cancel()
	t := time.Now()
	n, err := launch.Launch(ctx, o)
	if err != nil {
		return calibrationRun{}, err
	}
	defer n.Close()
	m, err := n.WaitForLine(ctx, calibrationRE)
	if err != nil {
		return calibrationRun{}, err
	}
	wall := time.Since(t).Seconds()
	l, err := parseCalibrationLine(m[0])
	if err != nil {
		// calibinit prints its logs' last lines, then powers off.
		wctx, wcancel := context.WithTimeout(ctx, time.Minute)
		n.Wait(wctx)
		wcancel()
		return calibrationRun{}, fmt.Errorf("%w; console:\n%s", err, tailLines(n.Lines(), 40))
	}
	if want := variant; l.with != "" && l.with != want {
		return calibrationRun{}, fmt.Errorf("calibinit ran %q, not %q", l.with, want)
	}
	return calibrationRun{wall: wall, line: l}, nil
}

// calibrationPolicyFiles are Plinth's API server policies for the
// calibration's initramfs: each one's files under calibrationPolicyDir
// and its flags in KIND.args, as a first controller writes them
// (default admission policy, a first Secrets key).
func calibrationPolicyFiles() ([]launch.InitramfsFile, error) {
	keys, err := pki.NewSecretsKeys()
	if err != nil {
		return nil, err
	}
	var files []launch.InitramfsFile
	dir := strings.TrimPrefix(calibrationPolicyDir, "/")
	pols := kubernetes.APIServerPolicies(calibrationPolicyDir, kubernetes.AdmissionPolicy{}, keys)
	for _, kind := range kubernetes.APIServerPolicyKinds {
		p := pols[kind]
		for _, name := range slices.Sorted(maps.Keys(p.Files)) {
			files = append(files, launch.InitramfsFile{Name: dir + "/" + name, Mode: 0o600, Data: p.Files[name]})
		}
		files = append(files, launch.InitramfsFile{Name: dir + "/" + kind + ".args", Data: []byte(strings.Join(p.Args, "\n") + "\n")})
	}
	return files, nil
}

// calibrationEnvRE is an environment variant: it goes on the kernel's
// command line as calibration.env=NAME=VALUE, so no spaces.
var calibrationEnvRE = regexp.MustCompile(`^[A-Z_][A-Z0-9_]*=[^\s"]+$`)

// calibrationVariants checks -calibrations: plain, Plinth's API server
// policy kinds joined by "+" ("all" is every kind), or NAME=VALUE (the
// plain start with that in the API server's environment).
func calibrationVariants(list string) ([]string, error) {
	var out []string
	for _, v := range strings.Split(list, ",") {
		if v = strings.TrimSpace(v); v == "" {
			continue
		}
		if v == "all" {
			v = strings.Join(kubernetes.APIServerPolicyKinds, "+")
		}
		if strings.Contains(v, "=") {
			if !calibrationEnvRE.MatchString(v) {
				return nil, fmt.Errorf("-calibrations: %q: want NAME=VALUE, NAME in capitals (an environment variable such as GOGC=400)", v)
			}
		} else if v != "plain" {
			for _, k := range strings.Split(v, "+") {
				if !slices.Contains(kubernetes.APIServerPolicyKinds, k) {
					return nil, fmt.Errorf("-calibrations: %q: no policy %q (want plain, all or %s joined by +)", v, k, strings.Join(kubernetes.APIServerPolicyKinds, ", "))
				}
			}
		}
		out = append(out, v)
	}
	return out, nil
}

func medianOf(runs []calibrationRun, f func(calibrationRun) float64) float64 {
	var xs []float64
	for _, r := range runs {
		xs = append(xs, f(r))
	}
	return median(xs)
}

// calibrationCmdline is the image's kernel command line without Plinth's
// own parameters (the verity root the bare initramfs has not).
func calibrationCmdline(cmdline string) string {
	var keep []string
	for _, f := range strings.Fields(cmdline) {
		if !strings.HasPrefix(f, "plinth.") {
			keep = append(keep, f)
		}
	}
	if len(keep) == 0 {
		return "console=ttyS0 panic=-1"
	}
	return strings.Join(keep, " ")
}

// sameAsImage fails unless the file bin is the image's system file at
// path (its manifest's SHA-256): the calibration runs the image's own
// binary.
func sameAsImage(img *launch.Image, bin, path string) error {
	want, ok := img.Manifest.SystemFiles[path]
	if !ok {
		return fmt.Errorf("the image's manifest lists no %s", path)
	}
	f, err := os.Open(bin)
	if err != nil {
		return fmt.Errorf("%w (make image builds it)", err)
	}
	defer f.Close()
	h := sha256.New()
	if _, err := io.Copy(h, f); err != nil {
		return err
	}
	if got := hex.EncodeToString(h.Sum(nil)); got != want.SHA256 {
		return fmt.Errorf("%s (sha256 %.12s) is not the image's %s (%.12s): rebuild the image or pass its -bin", bin, got, path, want.SHA256)
	}
	return nil
}

func tailLines(lines []string, n int) string {
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, "\n")
}

// ratios returns add, which also adds each Kubernetes start figure as a
// ratio to the calibration (name with _seconds replaced by _ratio).
func (c calibration) ratios(add addFunc) addFunc {
	if c.guest <= 0 || c.wall <= 0 {
		return add
	}
	return func(name string, v float64, unit, note string) {
		add(name, v, unit, note)
		var base float64
		var what string
		switch name {
		case "kubernetes_api_serving_guest_seconds", "kubernetes_reboot_api_serving_guest_seconds":
			base, what = c.guest, "guest uptime"
		case "kubernetes_api_serving_wall_seconds", "kubernetes_node_ready_wall_seconds", "kubernetes_reboot_api_serving_wall_seconds":
			base, what = c.wall, "wall"
		default:
			return
		}
		add(strings.TrimSuffix(name, "_seconds")+"_ratio", v/base, "x",
			fmt.Sprintf("%s / calibration's API server ready, %s (%.1f s)", strings.TrimPrefix(strings.TrimSuffix(name, "_seconds"), "kubernetes_"), what, base))
	}
}
