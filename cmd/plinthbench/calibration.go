package main

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"time"

	"plinth.dev/plinth/platform/layout"
	"plinth.dev/plinth/vmtest"
)

// calibration is this run's yardstick for the Kubernetes figures: the
// image's own `kube apiserver` alone with a plain embedded etcd on
// tmpfs, booted as a bare initramfs (vmtest/calibinit as /init) on the
// image's kernel in a node's VM shape, timed to its first /readyz 200.
// The kubernetes section divides its start figures by it: the machine's
// speed (TCG, load) moves both, the ratio is Plinth's own cost. Zero
// means not measured.
type calibration struct {
	wall  float64 // launch to the console line
	guest float64 // guest uptime at the first /readyz 200
}

// calibrationLine is what calibinit prints (vmtest/calibinit): uptimes
// in seconds, memory in MiB; zero where the line does not say.
type calibrationLine struct {
	exec, ready        float64
	init, etcd         float64
	apiRSSMiB, initRSS float64
}

// calibrationRE matches calibinit's result or failure line.
var calibrationRE = regexp.MustCompile(`calibration: (?:exec at|failed:).*`)

var (
	calibResultRE = regexp.MustCompile(`calibration: exec at ([0-9.]+) s, ready at ([0-9.]+) s uptime`)
	calibFailedRE = regexp.MustCompile(`calibration: failed: (.*)`)
	calibExtraRE  = map[string]*regexp.Regexp{
		"init":    regexp.MustCompile(`\binit ([0-9.]+) s\b`),
		"etcd":    regexp.MustCompile(`\betcd ready ([0-9.]+) s\b`),
		"apiRSS":  regexp.MustCompile(`\bapiserver peak rss ([0-9.]+) MiB\b`),
		"initRSS": regexp.MustCompile(`\binit peak rss ([0-9.]+) MiB\b`),
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
	for k, p := range map[string]*float64{"init": &l.init, "etcd": &l.etcd, "apiRSS": &l.apiRSSMiB, "initRSS": &l.initRSS} {
		if x := calibExtraRE[k].FindStringSubmatch(rest); x != nil {
			*p, _ = strconv.ParseFloat(x[1], 64)
		}
	}
	return l, nil
}

// benchCalibration builds the calibration's initramfs (calibinit, the
// image's kube binary from binDir, /etc/hosts), boots it once and
// reports its times.
func benchCalibration(ctx context.Context, img *vmtest.Image, binDir, work string, add addFunc) (calibration, error) {
	kube := filepath.Join(binDir, "kube")
	if err := sameAsImage(img, kube, layout.KubeBinary); err != nil {
		return calibration{}, err
	}
	dir := filepath.Join(work, "calibration")
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return calibration{}, err
	}
	initBin := filepath.Join(dir, "init")
	cmd := exec.Command("go", "build", "-trimpath", "-ldflags=-s -w", "-o", initBin, "./vmtest/calibinit")
	cmd.Env = append(os.Environ(), "CGO_ENABLED=0")
	if msg, err := cmd.CombinedOutput(); err != nil {
		return calibration{}, fmt.Errorf("building calibinit: %v: %s", err, msg)
	}
	// Uncompressed: gunzip of the 150 MB kube binary costs seconds of
	// guest time under TCG, before /init even starts.
	initramfs := filepath.Join(dir, "initramfs.cpio")
	if err := vmtest.BuildInitramfs(initBin, initramfs, false,
		vmtest.InitramfsFile{Name: "kube", Mode: 0o755, Source: kube},
		vmtest.InitramfsFile{Name: "etc/hosts", Data: []byte("127.0.0.1 localhost\n::1 localhost\n")},
	); err != nil {
		return calibration{}, err
	}

	o := img.NodeOptions("calibration")
	o.Initramfs, o.Cmdline = initramfs, calibrationCmdline(o.Cmdline)
	o.NoTPM = true
	o.WorkDir = filepath.Join(dir, "vm")
	if err := os.MkdirAll(o.WorkDir, 0o755); err != nil {
		return calibration{}, err
	}
	fmt.Fprintln(os.Stderr, "calibration: booting kube apiserver + etcd alone")
	ctx, cancel := context.WithTimeout(ctx, 20*time.Minute)
	defer cancel()
	t := time.Now()
	n, err := vmtest.Launch(ctx, o)
	if err != nil {
		return calibration{}, err
	}
	defer n.Close()
	m, err := n.WaitForLine(ctx, calibrationRE)
	if err != nil {
		return calibration{}, err
	}
	wall := time.Since(t).Seconds()
	l, err := parseCalibrationLine(m[0])
	if err != nil {
		// calibinit prints its logs' last lines, then powers off.
		wctx, wcancel := context.WithTimeout(ctx, time.Minute)
		n.Wait(wctx)
		wcancel()
		return calibration{}, fmt.Errorf("%w; console:\n%s", err, tailLines(n.Lines(), 40))
	}
	c := calibration{wall: wall, guest: l.ready}
	accel := accelName()
	add("calibration_apiserver_ready_wall_seconds", c.wall, "s", accel+", launch to the first /readyz 200 of kube apiserver alone (embedded etcd on tmpfs, bare initramfs, image's kernel)")
	add("calibration_apiserver_ready_guest_seconds", c.guest, "s", "guest uptime at that 200")
	add("calibration_apiserver_ready_after_exec_seconds", l.ready-l.exec, "s", "its exec to that 200")
	if l.init > 0 {
		add("calibration_init_guest_seconds", l.init, "s", "guest uptime at /init (kernel + unpacking the uncompressed initramfs)")
	}
	add("calibration_apiserver_exec_guest_seconds", l.exec, "s", "guest uptime at the exec (after certificates and etcd ready)")
	if l.apiRSSMiB > 0 {
		add("calibration_apiserver_peak_rss_mib", l.apiRSSMiB, "MiB", "peak resident memory (VmHWM) of kube apiserver at ready")
	}
	if l.initRSS > 0 {
		add("calibration_init_etcd_peak_rss_mib", l.initRSS, "MiB", "peak resident memory of /init with the embedded etcd at ready")
	}
	return c, nil
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
func sameAsImage(img *vmtest.Image, bin, path string) error {
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
