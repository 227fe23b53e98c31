// Command plinthbench measures image builds and boots and writes the
// numbers to a JSON file plus a table on stdout (`make bench`).
//
//	image build: cold (empty Go build cache for /init, new output dir) and warm
//	sizes:       initramfs, system image, /init, and what the system image
//	             carries for Kubernetes (kube, containerd, shim, crun, CNI
//	             plugins, container image archives; from the manifest)
//	boot:        launch → "node ready" of the real image, side by side with the
//	             same kernel booting a trivial init in the same run (ratio)
//	storage:     each storage step on first and later boots; dm-crypt against
//	             the raw disk inside the VM (ratio)
//	consensus:   bootstrap, AddNode → promoted learner, put latency namespaced
//	             against raw (the roleserver/consensus Go benchmarks)
//	cluster:     launch → HEALTHY of a bootstrap node (ratio to the bare boot),
//	             and a second node's launch → registered → approved → UP →
//	             HEALTHY (launch.LaunchCluster, AddNode)
//	calibration: the image's own kube apiserver alone with a plain embedded
//	             etcd on tmpfs, a bare initramfs on the image's kernel in a
//	             node's VM shape: launch → first /readyz 200 (guest uptime,
//	             time after its exec, CPU time); the kubernetes section's
//	             yardstick. -calibrations adds variants with Plinth's API
//	             server policies (admission, audit, encryption, all), or
//	             with an environment variable (GOGC=400), each a ratio to
//	             the plain start: what a policy or setting costs alone
//	kubernetes:  one-node cluster: launch → API serving, → Node Ready, a
//	             pod's start, CPU and memory, CPU at rest for a minute
//	             (each process's, QEMU's on the host), a reboot → API
//	             serving; each
//	             start figure also as a ratio to the calibration
//	update:      three consensus members booted from flashed disks: one node
//	             updated to the next image (bytes sent, install, reboot →
//	             HEALTHY), then all three with `plinthctl cluster update`
//
// -only runs some sections (e.g. -only cluster); the file then holds only
// their results. The cluster section needs the bare boot: without the boot
// section it boots the trivial init alone. Likewise the kubernetes section
// runs the calibration (just before it) whether selected or not.
// -calibration-rounds N boots each calibration variant N times,
// interleaved (medians; under TCG two identical boots differ by up to
// 20 %).
package main

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"maps"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"sort"
	"strconv"
	"strings"
	"time"

	"plinth.dev/plinth/board"
	"plinth.dev/plinth/image"
	"plinth.dev/plinth/launch"
)

type result struct {
	Name  string  `json:"name"`
	Value float64 `json:"value"`
	Unit  string  `json:"unit"`
	Note  string  `json:"note,omitempty"`
}

func main() {
	imageDir := flag.String("image", "out/image/"+board.Default, "built image to boot")
	nextDir := flag.String("next", "out/image-next/"+board.Default, "image the update section installs (make image-next)")
	initBin := flag.String("init", "out/bin/init", "static /init binary")
	binDir := flag.String("bin", "out/bin", "directory of the Kubernetes binaries and testpod (plinthctl build --bin)")
	cache := flag.String("cache", "out/cache", "kernel package cache")
	out := flag.String("out", "out/bench.json", "where to write the results")
	boots := flag.Int("boots", 3, "boots of each kind (median reported)")
	only := flag.String("only", "", "comma-separated `sections` to run, of "+strings.Join(sections, ",")+" (default all)")
	calibs := flag.String("calibrations", "plain,all", "calibration `variants`: plain (the yardstick, always run), all, Plinth's API server policies (admission, audit, encryption) joined by +, or NAME=VALUE (the plain start with that environment variable, e.g. GOGC=400)")
	calibRounds := flag.Int("calibration-rounds", 1, "boots of each calibration variant, interleaved (median reported)")
	flag.Parse()
	variants, err := calibrationVariants(*calibs)
	if err != nil {
		fmt.Fprintln(os.Stderr, "plinthbench:", err)
		os.Exit(2)
	}
	sel := map[string]bool{}
	for _, s := range strings.Split(*only, ",") {
		if s = strings.TrimSpace(s); s == "" {
			continue
		}
		if !slices.Contains(sections, s) {
			fmt.Fprintf(os.Stderr, "plinthbench: -only: unknown section %q (want %s)\n", s, strings.Join(sections, ","))
			os.Exit(2)
		}
		sel[s] = true
	}
	if len(sel) == 0 {
		for _, s := range sections {
			sel[s] = true
		}
	}
	if err := run(*imageDir, *nextDir, *initBin, *binDir, *cache, *out, *boots, sel, calibrationPlan{variants, max(*calibRounds, 1)}); err != nil {
		fmt.Fprintln(os.Stderr, "plinthbench:", err)
		os.Exit(1)
	}
}

// sections are what -only selects, in the order they run.
var sections = []string{"build", "sizes", "boot", "diskboot", "storage", "consensus", "cluster", "calibration", "kubernetes", "update"}

// calibrationPlan is what the calibration boots (-calibrations,
// -calibration-rounds).
type calibrationPlan struct {
	variants []string
	rounds   int
}

func run(imageDir, nextDir, initBin, binDir, cache, out string, boots int, sel map[string]bool, cp calibrationPlan) error {
	ctx := context.Background()
	work, err := os.MkdirTemp(filepath.Dir(out), "bench-")
	if err != nil {
		return err
	}
	if work, err = filepath.Abs(work); err != nil {
		return err
	}
	defer os.RemoveAll(work)
	var rs []result
	add := func(name string, v float64, unit, note string) {
		rs = append(rs, result{name, v, unit, note})
		fmt.Fprintf(os.Stderr, "  %-40s %10.2f %s\n", name, v, unit)
	}

	if sel["build"] {
		if err := benchBuild(ctx, cache, image.BinariesIn(binDir), work, add); err != nil {
			return err
		}
	}
	img, err := launch.LoadImage(imageDir)
	if err != nil {
		return err
	}
	if sel["sizes"] {
		for _, a := range []string{image.InitramfsFile, image.SystemFile, image.KernelFile} {
			add("size_"+a+"_mib", float64(img.Manifest.Artefacts[a].Size)/(1<<20), "MiB", "")
		}
		if st, err := os.Stat(initBin); err == nil {
			add("size_init_mib", float64(st.Size())/(1<<20), "MiB", "")
		}
		paths := slices.Sorted(maps.Keys(img.Manifest.SystemFiles))
		for _, p := range paths {
			add("size_"+filepath.Base(p)+"_mib", float64(img.Manifest.SystemFiles[p].Size)/(1<<20), "MiB", "in the system image at "+p)
		}
	}
	var bare bareBoot
	if sel["boot"] || sel["cluster"] {
		if bare, err = benchBoot(ctx, img, work, boots, sel["boot"], add); err != nil {
			return err
		}
	}
	if sel["diskboot"] {
		if err := benchDiskBoot(ctx, img, work, boots, add); err != nil {
			return fmt.Errorf("diskboot: %w", err)
		}
	}
	if sel["storage"] {
		if err := benchStorage(ctx, img, work, add); err != nil {
			return fmt.Errorf("storage: %w", err)
		}
	}
	if sel["consensus"] {
		if err := benchConsensus(add); err != nil {
			return fmt.Errorf("consensus: %w", err)
		}
	}
	if sel["cluster"] {
		if err := benchCluster(ctx, img, work, bare, add); err != nil {
			return fmt.Errorf("cluster: %w", err)
		}
	}
	// The ratios need the calibration in the same run, on the same load.
	var calib calibration
	if sel["calibration"] || sel["kubernetes"] {
		if calib, err = benchCalibration(ctx, img, binDir, work, cp.variants, cp.rounds, add); err != nil {
			return fmt.Errorf("calibration: %w", err)
		}
	}
	if sel["kubernetes"] {
		if err := benchKubernetes(ctx, img, binDir, work, calib.ratios(add)); err != nil {
			return fmt.Errorf("kubernetes: %w", err)
		}
	}
	if sel["update"] {
		next, err := launch.LoadImage(nextDir)
		if err != nil {
			return fmt.Errorf("update: %w", err)
		}
		if err := benchUpdate(ctx, img, next, filepath.Join(binDir, "plinthctl"), work, add); err != nil {
			return fmt.Errorf("update: %w", err)
		}
	}

	js, _ := json.MarshalIndent(map[string]any{"date": time.Now().UTC().Format(time.RFC3339), "board": img.Manifest.Board, "results": rs}, "", "  ")
	if err := os.WriteFile(out, append(js, '\n'), 0o644); err != nil {
		return err
	}
	fmt.Printf("%-40s %10s  %s\n", "benchmark", "value", "note")
	for _, r := range rs {
		fmt.Printf("%-40s %8.2f %-3s %s\n", r.Name, r.Value, r.Unit, r.Note)
	}
	fmt.Printf("written to %s\n", out)
	return nil
}

type addFunc = func(name string, v float64, unit, note string)

// benchBuild times a cold and a warm image build. Only /init is compiled
// here: the Kubernetes binaries come ready from bins (make builds them;
// the README gives their own cold and warm build times).
func benchBuild(ctx context.Context, cache string, bins image.Binaries, work string, add addFunc) error {
	b, _ := board.Get(board.Default)
	deb, err := image.FetchKernelPackage(ctx, b.KernelPackage, cache, os.Stderr)
	if err != nil {
		return err
	}
	// Cold: /init compiled with an empty build cache, then a build into a new directory.
	coldInit := filepath.Join(work, "init-cold")
	t := time.Now()
	cmd := exec.Command("go", "build", "-trimpath", "-o", coldInit, "./init")
	cmd.Env = append(os.Environ(), "CGO_ENABLED=0", "GOCACHE="+filepath.Join(work, "gocache"))
	if msg, err := cmd.CombinedOutput(); err != nil {
		return fmt.Errorf("cold go build: %v: %s", err, msg)
	}
	compile := time.Since(t)
	t = time.Now()
	if _, err := image.Build(ctx, image.Config{Board: b, KernelPackage: deb, Init: coldInit, Binaries: bins, OutDir: filepath.Join(work, "cold")}); err != nil {
		return err
	}
	add("build_cold_seconds", (compile + time.Since(t)).Seconds(), "s", fmt.Sprintf("go build of /init with empty cache %.1fs + image build", compile.Seconds()))
	t = time.Now()
	cmd = exec.Command("go", "build", "-trimpath", "-o", coldInit, "./init")
	cmd.Env = append(os.Environ(), "CGO_ENABLED=0")
	if msg, err := cmd.CombinedOutput(); err != nil {
		return fmt.Errorf("warm go build: %v: %s", err, msg)
	}
	var progress strings.Builder
	if _, err := image.Build(ctx, image.Config{Board: b, KernelPackage: deb, Init: coldInit, Binaries: bins, OutDir: filepath.Join(work, "warm"), Progress: &progress}); err != nil {
		return err
	}
	add("build_warm_seconds", time.Since(t).Seconds(), "s", "cached go build + image build")
	// Each step of the warm build: "[k/n] name ..." then "[k/n] done in Xs".
	names := map[string]string{}
	for _, m := range regexp.MustCompile(`(?m)^\[(\d+)/\d+\] (.+) \.\.\.$`).FindAllStringSubmatch(progress.String(), -1) {
		names[m[1]] = m[2]
	}
	for _, m := range regexp.MustCompile(`(?m)^\[(\d+)/\d+\] done in ([0-9.]+)s`).FindAllStringSubmatch(progress.String(), -1) {
		v, _ := strconv.ParseFloat(m[2], 64)
		add("build_step"+m[1]+"_seconds", v, "s", names[m[1]])
	}
	return nil
}

// bareBoot is the median bare boot (same kernel, trivial init) of this
// run, which the boot and cluster sections are compared with.
type bareBoot struct{ wall, guest float64 }

// benchBoot boots the image (unless !withNode) and the same kernel with a
// trivial init, interleaved, and reports both and their ratio.
func benchBoot(ctx context.Context, img *launch.Image, work string, boots int, withNode bool, add addFunc) (bareBoot, error) {
	bareDir := filepath.Join(work, "bare")
	os.MkdirAll(bareDir, 0o755)
	bareBin := filepath.Join(bareDir, "init")
	cmd := exec.Command("go", "build", "-trimpath", "-ldflags=-s -w", "-o", bareBin, "./launch/bareinit")
	cmd.Env = append(os.Environ(), "CGO_ENABLED=0")
	if msg, err := cmd.CombinedOutput(); err != nil {
		return bareBoot{}, fmt.Errorf("building bareinit: %v: %s", err, msg)
	}
	bareInitramfs := filepath.Join(bareDir, "initramfs.gz")
	if err := launch.BuildBareInitramfs(bareBin, bareInitramfs); err != nil {
		return bareBoot{}, err
	}

	params, err := launch.WriteParameters(filepath.Join(work, "parameters.pb"), launch.BootstrapParameters())
	if err != nil {
		return bareBoot{}, err
	}
	var nodeWall, nodeGuest, bareWall, bareGuest []float64
	nodeDir := filepath.Join(work, "node")
	os.MkdirAll(filepath.Join(nodeDir, "tpm"), 0o755)
	// Boot 0 sets the data disk up; the measured boots unlock it, as every
	// boot of a node after its first does.
	first := -1
	if !withNode {
		first = 0
	}
	for i := first; i < boots; i++ {
		if withNode {
			o := img.NodeOptions("bench").WithParameters(params)
			o.WorkDir = filepath.Join(nodeDir, fmt.Sprint(i+1))
			o.DiskPath, o.DiskSizeBytes = filepath.Join(nodeDir, "disk.img"), 1<<30
			o.TPMStateDir = filepath.Join(nodeDir, "tpm")
			w, g, err := bootUntil(ctx, o, `I init: node ready uptime=([0-9.]+)s`)
			if err != nil {
				return bareBoot{}, fmt.Errorf("node boot: %w", err)
			}
			if i < 0 {
				continue
			}
			nodeWall, nodeGuest = append(nodeWall, w), append(nodeGuest, g)
		}
		// Interleaved, so both kinds see the same machine load.
		o := img.NodeOptions("bare")
		o.Initramfs, o.Cmdline = bareInitramfs, "console=ttyS0 panic=-1"
		o.WorkDir = filepath.Join(work, fmt.Sprintf("bare%d", i))
		w, g, err := bootUntil(ctx, o, `bareinit: reached userspace uptime=([0-9.]+)`)
		if err != nil {
			return bareBoot{}, fmt.Errorf("bare boot: %w", err)
		}
		bareWall, bareGuest = append(bareWall, w), append(bareGuest, g)
	}
	note := fmt.Sprintf("median of %d, %s", boots, accelName())
	bare := bareBoot{median(bareWall), median(bareGuest)}
	if withNode {
		add("boot_to_core_ready_wall_seconds", median(nodeWall), "s", note+", launch to 'node ready'")
		add("boot_to_core_ready_guest_seconds", median(nodeGuest), "s", note+", guest uptime at 'node ready'")
	}
	add("bare_boot_wall_seconds", bare.wall, "s", note+", same kernel, trivial init")
	add("bare_boot_guest_seconds", bare.guest, "s", note+", guest uptime at trivial init")
	if withNode {
		add("boot_ratio_wall", median(nodeWall)/bare.wall, "x", "core ready / bare init, wall")
		add("boot_ratio_guest", median(nodeGuest)/bare.guest, "x", "core ready / bare init, guest uptime")
	}
	return bare, nil
}

func accelName() string {
	if launch.KVMAvailable() {
		return "KVM"
	}
	return "TCG"
}

// bootUntil launches o and returns wall seconds until re matched and the
// guest uptime it captured.
func bootUntil(ctx context.Context, o launch.NodeOptions, re string) (float64, float64, error) {
	ctx, cancel := context.WithTimeout(ctx, 3*time.Minute)
	defer cancel()
	if err := os.MkdirAll(o.WorkDir, 0o755); err != nil {
		return 0, 0, err
	}
	t := time.Now()
	n, err := launch.Launch(ctx, o)
	if err != nil {
		return 0, 0, err
	}
	defer n.Close()
	m, err := n.WaitForLine(ctx, regexp.MustCompile(re))
	if err != nil {
		return 0, 0, err
	}
	wall := time.Since(t).Seconds()
	guest, _ := strconv.ParseFloat(m[1], 64)
	return wall, guest, nil
}

func median(xs []float64) float64 {
	s := append([]float64(nil), xs...)
	sort.Float64s(s)
	return s[len(s)/2]
}
