package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log"
	"log/slog"
	"os"
	"os/signal"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"golang.org/x/sys/unix"
	"google.golang.org/grpc/grpclog"

	"plinth.dev/plinth/platform/bootdisk"
	"plinth.dev/plinth/platform/console"
	"plinth.dev/plinth/platform/kmod"
	"plinth.dev/plinth/platform/layout"
	"plinth.dev/plinth/platform/logtree"
	"plinth.dev/plinth/platform/mount"
	"plinth.dev/plinth/platform/power"
	"plinth.dev/plinth/platform/reaper"
	datadisk "plinth.dev/plinth/platform/storage"
	"plinth.dev/plinth/platform/supervisor"
	"plinth.dev/plinth/platform/sysimage"
	"plinth.dev/plinth/platform/verity"
	"plinth.dev/plinth/roleserver/localstorage"
)

// bootCore brings the node up and returns the exit code that tells PID 1
// what to do next (reaper.ExitPowerOff / ExitReboot): the boot steps
// (boot.go), then the supervised node (node.go).
func bootCore() int {
	logs := startLogging()
	// The console is written asynchronously: its last lines must be out
	// before PID 1 powers off.
	defer logs.Flush(3 * time.Second)
	b := newBoot(logs)
	b.l.Info("Plinth core starting", "version", b.version, "uptime", uptime())
	if code, ok := b.run(); !ok {
		return code
	}
	b.benchmark()
	reportHardware(b.l)
	return runNode(b)
}

// startLogging makes the node's log tree and sends the core's lines, the
// standard logger's and gRPC's to it.
func startLogging() *logtree.Tree {
	logs := logtree.New(16384)
	// The console gets the node's own lines; child processes (Kubernetes)
	// report only errors there, the rest stays in the log buffer.
	logs.AddSink(os.Stdout, logtree.NotProcessOutput)
	// So do the other consoles the command line names (a screen and a
	// serial port: the generic board has both).
	for _, c := range console.OpenOthers() {
		logs.AddSink(c, logtree.NotProcessOutput)
	}
	log.SetFlags(0)
	log.SetOutput(logs.Writer("init.stdlog", slog.LevelInfo))
	// gRPC's own logger would write unformatted lines to the console.
	grpclog.SetLoggerV2(grpclog.NewLoggerV2(io.Discard, logs.Writer("grpc", slog.LevelWarn), logs.Writer("grpc", slog.LevelError)))
	return logs
}

func closeDataVolume(l *slog.Logger, local *localstorage.Root) {
	if !mounted(local.Data.Path()) {
		l.Info("data volume was not open")
	} else if err := datadisk.Close(local.Data.Path()); err != nil {
		l.Error("closing the data volume", "err", err)
	} else {
		l.Info("data volume unmounted")
	}
}

var runtimeMounts = []mount.Mount{
	{Source: "devpts", Target: "/dev/pts", FSType: "devpts", Flags: unix.MS_NOSUID | unix.MS_NOEXEC, Data: "gid=5,mode=620,ptmxmode=666"},
	{Source: "shm", Target: "/dev/shm", FSType: "tmpfs", Flags: unix.MS_NOSUID | unix.MS_NODEV, Data: "mode=1777"},
	{Source: "run", Target: "/run", FSType: "tmpfs", Flags: unix.MS_NOSUID | unix.MS_NODEV, Data: "mode=0755"},
}

// moduleDir is /lib/modules/VERSION of the running kernel, in the
// initramfs and in the system image alike.
func moduleDir() string {
	var u unix.Utsname
	unix.Uname(&u)
	return filepath.Join("/lib/modules", unix.ByteSliceToString(u.Release[:]))
}

func loadModules() (string, error) {
	dir := moduleDir()
	loaded, skipped, err := kmod.LoadList(dir, "/"+layout.ModuleLoadList)
	detail := fmt.Sprintf("%d modules: %s", len(loaded), strings.Join(loaded, " "))
	if len(skipped) > 0 {
		detail += "; no hardware for: " + strings.Join(skipped, " ")
	}
	return detail, err
}

// openSystemImage maps the system image through dm-verity and mounts it.
// Every block a process reads is checked against the root hash from the
// (measured) command line; watchSystemImage reads the rest. In a disk
// boot (plinth.slot= in the UKI's command line) the image is the slot's
// partition on the disk the UKI came from; otherwise it is the file in
// the initramfs. b.bootDisk is that disk, also when the UKI came from a
// disk without naming a slot, nil when the node did not boot from a disk.
func (b *boot) openSystemImage() (string, error) {
	raw, ok := b.args["plinth.verity"]
	if !ok {
		return "", errors.New("no plinth.verity= on the kernel command line: refusing to use an unverified system image")
	}
	p, err := verity.ParseParams(raw)
	if err != nil {
		return "", err
	}
	slot := b.args[layout.SlotArg]
	if slot != "" && slot != "a" && slot != "b" {
		return "", fmt.Errorf("%s=%q on the kernel command line: want a or b", layout.SlotArg, slot)
	}
	disk, err := findBootDisk(slot)
	if err != nil {
		return "", err
	}
	source, where := "/"+layout.SystemImagePath, "the initramfs"
	if slot != "" {
		if source, _, err = disk.Slot(slot); err != nil {
			return "", err
		}
		where = "slot " + slot
	}
	r, err := sysimage.Open(source, p)
	if err != nil {
		return "", err
	}
	if err := sysimage.Mount(r.Device, "/newroot", "squashfs"); err != nil {
		// dm-verity refused a block the mount read: say which, and that
		// it is the image, not the node.
		if _, verr := sysimage.Verify(context.Background(), r.Device, r.Size, sysimage.Pace{Busy: 1}); errors.Is(verr, sysimage.ErrTampered) {
			return "", fmt.Errorf("the system image in %s does not match its root hash (tampered or corrupt; nothing else on the disk was touched): %w", where, verr)
		}
		return "", err
	}
	b.system, b.image, b.bootDisk = p, r, disk
	return fmt.Sprintf("%s on %s (%s), %d MiB, root hash %x: every block is checked when read", r.Device, r.Loop, where, r.Size>>20, p.RootHash), nil
}

// findBootDisk returns the flashed disk the UKI was loaded from (or, for
// a slot named without the firmware saying where the UKI came from, the
// only disk with that slot); nil when the node did not boot from a disk.
func findBootDisk(slot string) (*bootdisk.Boot, error) {
	if err := bootdisk.MountEFIVars(); err != nil {
		return nil, err
	}
	esp, err := bootdisk.LoaderDevicePartUUID(bootdisk.EFIVarsDir)
	if err != nil {
		return nil, err
	}
	if esp == "" && slot == "" {
		return nil, nil
	}
	return bootdisk.Find(context.Background(), esp, slot, 10*time.Second)
}

// systemImagePace keeps the full read out of the boot's way: 1 MiB at a
// time, reading a quarter of the time. Measured under TCG (2 vCPUs, loaded
// host): boot → ready no slower than with the old 3 MiB image read through
// before the mount; 65 MiB verified ~11 s after the read started.
var systemImagePace = sysimage.Pace{Chunk: 1 << 20, Busy: 0.25}

// imageHaltedMessage ends a node whose system image failed verification.
const imageHaltedMessage = "node halted: the system image does not match its root hash (tampered or corrupt); power the node off and boot a good image"

// watchSystemImage reads the whole system image in the background, so
// that a tampered block is found even if nothing reads it for a long time
// (dm-verity already refuses it to any reader). The returned channel
// receives if a block does not match: the core then stops everything and
// halts, as for a failed boot step. An error that says nothing about the
// image (it could not be opened for reading) is logged, not halted for.
func watchSystemImage(l *slog.Logger, r *sysimage.Result, p verity.Params) <-chan error {
	bad := make(chan error, 1)
	go func() {
		v, err := sysimage.Verify(context.Background(), r.Device, r.Size, systemImagePace)
		switch {
		case errors.Is(err, sysimage.ErrTampered):
			l.Error("system image verification failed", "err", err, "read", fmt.Sprintf("%d MiB in %v", v.Bytes>>20, v.Took.Round(time.Millisecond)))
			bad <- err
		case err != nil:
			l.Error("system image could not be read through (dm-verity still checks every block read)", "err", err)
		default:
			l.Info("system image verified", "detail", fmt.Sprintf("%s: %d MiB in %v, %v of it reading, O_DIRECT %v (verity status %s), root hash %x",
				r.Device, v.Bytes>>20, v.Took.Round(time.Millisecond), v.Busy.Round(time.Millisecond), v.Direct, v.Status, p.RootHash))
		}
	}()
	return bad
}

// enterSystemImage switches root into the mounted system image and
// mounts what the node needs there.
func enterSystemImage() (string, error) {
	if err := mount.SwitchRoot("/newroot", layout.MovedMounts); err != nil {
		return "", err
	}
	// Container runtimes and kubelet rely on mount propagation from /.
	if err := unix.Mount("", "/", "", unix.MS_REC|unix.MS_SHARED, ""); err != nil {
		return "", fmt.Errorf("making / shared: %w", err)
	}
	if err := mount.All([]mount.Mount{
		// /tmp is the pods' (host paths may name it: nothing of the
		// node's lives here), bounded, and no symbolic link inside it
		// is followed: a link one pod plants there leads another's
		// host path nowhere (layout.TmpMount says why).
		{Source: "tmp", Target: layout.TmpMount, FSType: "tmpfs", Flags: unix.MS_NOSUID | unix.MS_NODEV | unix.MS_NOSYMFOLLOW, Data: layout.TmpMountOptions},
		{Source: "ephemeral", Target: "/ephemeral", FSType: "tmpfs", Flags: unix.MS_NOSUID | unix.MS_NODEV, Data: "mode=0755"},
	}); err != nil {
		return "", err
	}
	root, err := mount.Find("/")
	if err != nil {
		return "", err
	}
	mode := "read-write"
	if root.ReadOnly() {
		mode = "read-only"
	}
	return fmt.Sprintf("root filesystem: %s %s %s", root.Source, root.FSType, mode), nil
}

// The CPU weights of the core's and the runtime's cgroups (setupCgroups).
const (
	coreCPUWeight    = 200
	runtimeCPUWeight = 100
)

// setupCgroups mounts cgroup2, moves the core into a leaf, so that
// controllers can be enabled for the workloads below the root, and makes
// the container runtime's cgroup.
func setupCgroups() (string, error) {
	const root = "/sys/fs/cgroup"
	if err := mount.All([]mount.Mount{{Source: "cgroup2", Target: root, FSType: "cgroup2",
		Flags: unix.MS_NOSUID | unix.MS_NODEV | unix.MS_NOEXEC, Data: "nsdelegate,memory_recursiveprot"}}); err != nil {
		return "", err
	}
	leaf := filepath.Join(root, "init")
	if err := os.MkdirAll(leaf, 0o755); err != nil {
		return "", err
	}
	if err := os.WriteFile(filepath.Join(leaf, "cgroup.procs"), []byte(fmt.Sprint(os.Getpid())), 0); err != nil {
		return "", fmt.Errorf("moving core into %s: %w", leaf, err)
	}
	avail, err := os.ReadFile(filepath.Join(root, "cgroup.controllers"))
	if err != nil {
		return "", err
	}
	var enable []string
	for _, c := range strings.Fields(string(avail)) {
		enable = append(enable, "+"+c)
	}
	if err := os.WriteFile(filepath.Join(root, "cgroup.subtree_control"), []byte(strings.Join(enable, " ")), 0); err != nil {
		return "", fmt.Errorf("enabling controllers %v: %w", enable, err)
	}
	// CPU under contention goes core first, then the container runtime
	// (containerd, its shims, the kubelet), then the pods:
	//
	//	/sys/fs/cgroup/init      the core (etcd, API server, …)   weight 200
	//	/sys/fs/cgroup/runtime   containerd, shims, kubelet       weight 100
	//	/sys/fs/cgroup/kubepods  the pods (the kubelet sets it    weight 79 on 2 CPUs,
	//	                         from the allocatable CPU)        39 on a 2-CPU controller,
	//	                                                          which keeps 1 CPU back
	//	                                                          (kubernetes.controlPlaneCPU)
	//
	// The core above the runtime: while pods start, the runtime's many
	// threads (a shim per pod, crun, CNI plugins) would otherwise take the
	// vCPUs the API server and etcd need (100 pods under TCG: reported in
	// a quarter of the time, no controller lease lost). Not far above: at
	// a fifth of the core's weight a busy controller's runtime pulled a
	// small image in minutes and its kubelet missed metrics scrapes. The
	// runtime above the pods: below them, an image pull beside three
	// spinning pods took over ten times as long as on an idle node.
	if err := os.WriteFile(filepath.Join(leaf, "cpu.weight"), []byte(strconv.Itoa(coreCPUWeight)), 0); err != nil {
		return "", fmt.Errorf("core cgroup: %w", err)
	}
	runtime := filepath.Join(root, "runtime")
	if err := os.MkdirAll(runtime, 0o755); err != nil {
		return "", err
	}
	if err := os.WriteFile(filepath.Join(runtime, "cpu.weight"), []byte(strconv.Itoa(runtimeCPUWeight)), 0); err != nil {
		return "", fmt.Errorf("runtime cgroup: %w", err)
	}
	return "core in " + leaf + ", controllers " + strings.Join(enable, " "), nil
}

// reportReadiness logs once when every runnable is healthy, and later
// whenever that changes.
func reportReadiness(ctx context.Context, l *slog.Logger, sup *supervisor.Supervisor) {
	wasHealthy := false
	for {
		ch := sup.Changed()
		healthy := sup.Healthy()
		if healthy != wasHealthy {
			var names []string
			for _, st := range sup.Snapshot() {
				names = append(names, st.DN+"="+string(st.State))
			}
			if healthy {
				l.Info("all supervised runnables healthy", "runnables", strings.Join(names, ","))
				l.Info("node ready", "uptime", uptime())
			} else if ctx.Err() == nil {
				l.Warn("node degraded", "runnables", strings.Join(names, ","))
			}
			wasHealthy = healthy
		}
		select {
		case <-ch:
		case <-ctx.Done():
			return
		}
	}
}

func notStopped(sup *supervisor.Supervisor) string {
	var s []string
	for _, st := range sup.Snapshot() {
		if st.State != supervisor.StateStopped {
			s = append(s, st.DN)
		}
	}
	return strings.Join(s, ",")
}

// waitForShutdownRequest returns the exit code for the first request: the
// power button, SIGTERM/SIGPWR forwarded by PID 1 (power off) or SIGINT,
// which is Ctrl-Alt-Del (reboot); or the error from imageBad (nil: never),
// on which the node must halt.
func waitForShutdownRequest(l *slog.Logger, button <-chan int, imageBad <-chan error) (int, error) {
	sigs := make(chan os.Signal, 1)
	signal.Notify(sigs, unix.SIGTERM, unix.SIGINT, unix.SIGPWR)
	select {
	case code := <-button:
		return code, nil
	case err := <-imageBad:
		return 0, err
	case sig := <-sigs:
		l.Info("shutdown requested", "signal", sig.String())
		if sig == unix.SIGINT {
			return reaper.ExitReboot, nil
		}
		return reaper.ExitPowerOff, nil
	}
}

// waitForPowerOff keeps a failed node alive and responsive to power-off.
func waitForPowerOff(logs *logtree.Tree) int {
	shutdown := make(chan int, 1)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	supervisor.New(ctx, logs, power.WatchButton(func() {
		select {
		case shutdown <- reaper.ExitPowerOff:
		default:
		}
	}), supervisor.Options{})
	code, _ := waitForShutdownRequest(logs.Logger("init"), shutdown, nil)
	unix.Sync()
	return code
}

func uptime() string {
	b, err := os.ReadFile("/proc/uptime")
	if err != nil {
		return "?"
	}
	f := strings.Fields(string(b))
	if len(f) == 0 {
		return "?"
	}
	return f[0] + "s"
}
