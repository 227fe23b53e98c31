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
	"strings"
	"sync/atomic"
	"time"

	"golang.org/x/sys/unix"
	"google.golang.org/grpc/grpclog"

	"plinth.dev/plinth/api/clusterpb"
	"plinth.dev/plinth/platform/bootdisk"
	"plinth.dev/plinth/platform/cmdline"
	"plinth.dev/plinth/platform/console"
	"plinth.dev/plinth/platform/eventlog"
	"plinth.dev/plinth/platform/kmod"
	"plinth.dev/plinth/platform/layout"
	"plinth.dev/plinth/platform/logtree"
	"plinth.dev/plinth/platform/measure"
	"plinth.dev/plinth/platform/mount"
	"plinth.dev/plinth/platform/network"
	"plinth.dev/plinth/platform/power"
	"plinth.dev/plinth/platform/reaper"
	datadisk "plinth.dev/plinth/platform/storage"
	"plinth.dev/plinth/platform/supervisor"
	"plinth.dev/plinth/platform/sysimage"
	"plinth.dev/plinth/platform/tpm"
	"plinth.dev/plinth/platform/update"
	"plinth.dev/plinth/platform/verity"
	"plinth.dev/plinth/roleserver"
	"plinth.dev/plinth/roleserver/enrolment"
	"plinth.dev/plinth/roleserver/kubernetes"
	"plinth.dev/plinth/roleserver/localstorage"
	"plinth.dev/plinth/roleserver/parameters"
)

// bootCore brings the node up and returns the exit code that tells PID 1
// what to do next (reaper.ExitPowerOff / ExitReboot).
func bootCore() int {
	logs := logtree.New(16384)
	// The console gets the node's own lines; child processes (Kubernetes)
	// report only errors there, the rest stays in the log buffer.
	logs.AddSink(os.Stdout, logtree.NotProcessOutput)
	// So do the other consoles the command line names (a screen and a
	// serial port: the generic board has both).
	for _, c := range console.OpenOthers() {
		logs.AddSink(c, logtree.NotProcessOutput)
	}
	// The console is written asynchronously: its last lines must be out
	// before PID 1 powers off.
	defer logs.Flush(3 * time.Second)
	log.SetFlags(0)
	log.SetOutput(logs.Writer("init.stdlog", slog.LevelInfo))
	// gRPC's own logger would write unformatted lines to the console.
	grpclog.SetLoggerV2(grpclog.NewLoggerV2(io.Discard, logs.Writer("grpc", slog.LevelWarn), logs.Writer("grpc", slog.LevelError)))
	l := logs.Logger("init")
	l.Info("Plinth core starting", "version", version, "uptime", uptime())

	var (
		args   map[string]string
		system verity.Params
		params *parameters.Loaded
		keys   datadisk.KeyProtector
		chip   *tpm.TPM
		local  = &localstorage.Root{}
		// registering: the node parameters say register, so the data
		// volume opens only after the cluster hands over its key.
		registering bool
		diskCfg     datadisk.Config
		sysImage    *sysimage.Result
		// boot is the flashed disk the node booted from, nil if none.
		boot *bootdisk.Boot
		// firmware is what the firmware measured this boot.
		firmware measure.Firmware
		// imageBad receives if the background read of the whole system
		// image finds a block that does not match the root hash.
		imageBad <-chan error
		// upd is this node's side of A/B updates; volume the data volume
		// once open (an update seals its key again).
		upd    *update.Node
		volume *datadisk.Result
	)
	// The boot, in order. Each step logs what it did and how long it took.
	// A failed step leaves the node waiting, saying why, and still
	// answering a power-off request: no silent hang, no reboot loop.
	steps := []struct {
		name string
		run  func() (string, error)
	}{
		{"early mounts", func() (detail string, err error) {
			if err := mount.All(runtimeMounts); err != nil {
				return "", err
			}
			args, err = cmdline.Read()
			return "devpts, shm, run", err
		}},
		{"load early kernel modules", loadModules},
		// Before the system image: a trial boot that fails from here on
		// reboots into the previous slot.
		{"A/B update state", func() (detail string, err error) {
			upd, detail, err = startUpdates(l, args)
			return detail, err
		}},
		{"map and mount the system image (dm-verity)", func() (detail string, err error) {
			system, sysImage, boot, detail, err = openSystemImage(args)
			upd.Boot = boot
			return detail, err
		}},
		{"switch root into the system image", func() (string, error) {
			detail, err := switchRoot()
			if board, v := imageRelease(); v != "" {
				upd.Board, version = board, v
				detail += fmt.Sprintf("; image version %s for board %s", v, board)
			}
			return detail, err
		}},
		{"verify the whole system image in the background", func() (string, error) {
			imageBad = verifySystemImage(l, sysImage, system)
			return fmt.Sprintf("%d MiB, reading %.0f%% of the time", sysImage.Size>>20, systemImagePace.Busy*100), nil
		}},
		{"cgroup2", setupCgroups},
		// What this node is for. Without valid parameters it waits:
		// nothing below may touch the disk on a guess.
		{"read node parameters", func() (detail string, err error) {
			params, detail, err = readParameters(args, boot)
			registering = params != nil && params.Params.GetRegister() != nil
			return detail, err
		}},
		{"TPM and measured boot", func() (detail string, err error) {
			var events []eventlog.Event
			firmware, events = firmwareMeasurements()
			upd.Events = events
			chip, keys, detail, err = measureBoot(l, params, system, firmware, upd)
			if err == nil {
				go checkPredictions(l, chip, boot, events)
			}
			return detail, err
		}},
		// Which disk is chosen here, once; enrolment uses the same one.
		{"open data disk", func() (detail string, err error) {
			if v, ok := args[haltArg]; ok {
				if v == "hang" {
					// A hang, as a test image needs one: the whole core
					// stops (PID 1 keeps waiting for it).
					l.Error(haltArg + "=hang on the kernel command line: the core stops here")
					logs.Flush(3 * time.Second)
					unix.Kill(os.Getpid(), unix.SIGSTOP)
					// The stop reaches every thread, this one included,
					// only when each is next interrupted (under TCG that
					// took long enough for this step to fail and the
					// trial to reboot by itself): wait for it here.
					for {
						time.Sleep(time.Hour)
					}
				}
				return "", fmt.Errorf("%s=%s on the kernel command line: the image stops before it opens the data disk", haltArg, v)
			}
			diskCfg, volume, detail, err = openDataDisk(l, params, keys, chip, local, registering)
			return detail, err
		}},
	}
	for _, s := range steps {
		t := time.Now()
		detail, err := s.run()
		if err != nil {
			l.Error("boot step failed: "+s.name, "err", err)
			if upd != nil && upd.Kind() == update.BootTrial {
				closeDataVolume(l, local)
				unix.Sync()
				l.Error("trial boot of an update failed: rebooting into the previous slot")
				l.Info("filesystems synced, handing over to PID 1", "action", "reboot")
				return reaper.ExitReboot
			}
			l.Error("node halted: the boot cannot continue; power the node off, fix the cause and boot again")
			return waitForPowerOff(logs)
		}
		l.Info(s.name, "detail", detail, "took", time.Since(t))
		select {
		case <-imageBad:
			closeDataVolume(l, local)
			unix.Sync()
			l.Error(imageHaltedMessage)
			return waitForPowerOff(logs)
		default:
		}
	}
	if args["plinth.bench"] == "storage" {
		benchmarkStorage(l, diskCfg.Disk)
	}
	reportHardware(l)
	return runNode(logs, l, &nodeState{params: params, local: local, keys: keys, chip: chip, disk: diskCfg, imageBad: imageBad, firmware: firmware, upd: upd, volume: volume})
}

// haltArg on the (measured) kernel command line stops the boot before the
// data disk is opened: for images that must not join a cluster (a
// debugging image; the update test's image that fails its trial boot).
// "hang" stops the core process instead of failing the step.
const haltArg = "plinth.halt"

// nodeState is what the boot steps hand to the supervised node.
type nodeState struct {
	params *parameters.Loaded
	local  *localstorage.Root
	keys   datadisk.KeyProtector
	chip   *tpm.TPM
	disk   datadisk.Config
	// imageBad: see verifySystemImage.
	imageBad <-chan error
	// firmware: what the firmware measured (an unmeasured boot is a
	// problem in the node's status).
	firmware measure.Firmware
	// upd: A/B updates; volume: the data volume if init opened it (a
	// registering node's is opened by enrolment).
	upd    *update.Node
	volume *datadisk.Result
}

// runNode runs the supervisor tree until a shutdown request, then stops
// it, closes the data volume and returns PID 1's exit code.
func runNode(logs *logtree.Tree, l *slog.Logger, n *nodeState) int {
	ctx, cancel := context.WithCancel(context.Background())
	shutdown := make(chan int, 1)
	requestShutdown := func(code int) {
		select {
		case shutdown <- code:
		default:
		}
	}
	netConfig, err := networkConfig(n.params)
	if err != nil {
		// Validated parameters cannot get here; keep DHCP rather than no network.
		l.Error("static network configuration unusable, using DHCP", "err", err)
	}
	net := network.New(netConfig)
	var (
		sup   *supervisor.Supervisor
		enrol *enrolment.Config
		// volume is the open data volume, for an update's reseal.
		volume atomic.Pointer[datadisk.Result]
	)
	roles := roleserver.New(roleserver.Config{
		StorageRoot:  n.local,
		Network:      net,
		LogTree:      logs,
		BootProblems: unmeasuredProblem(n.firmware),
		Version:      version,
		BootTime:     bootTime(),
		HostsPath:    "/run/hosts",
		Power: func(reboot bool) {
			if reboot {
				requestShutdown(reaper.ExitReboot)
			} else {
				requestShutdown(reaper.ExitPowerOff)
			}
		},
		Runnables:  func() []supervisor.Status { return sup.Snapshot() },
		ResolvConf: "/run/resolv.conf",
		LoadKubernetesModules: func() error {
			loaded, _, err := kmod.LoadList(moduleDir(), layout.KubernetesModuleLoadList)
			if err == nil {
				l.Info("Kubernetes kernel modules loaded", "modules", len(loaded))
			}
			return err
		},
		StopPods:         kubernetes.StopPods,
		LocalClusterKey:  func(keep bool) error { return enrol.KeepClusterKeyLocally(keep) },
		CuratorEndpoints: n.params.Params.GetRegister().GetCuratorEndpoints(),
		Updates:          n.upd,
		DirectoryChanged: func(d *clusterpb.ClusterDirectory) error { return enrol.UpdateDirectory(d) },
	})
	enrol = &enrolment.Config{
		Parameters: n.params.Params,
		Root:       n.local,
		Keys:       n.keys,
		TPMUsage:   tpmUsage(n.chip),
		Disk:       n.disk,
		VolumeOpened: func(r *datadisk.Result) error {
			volume.Store(r)
			_, err := volumeOpened(l, n.chip, n.local, r)
			return err
		},
		Network:    net,
		RoleServer: roles,
		Version:    version,
		BootTime:   bootTime(),
	}
	if n.volume != nil {
		volume.Store(n.volume)
	}
	if n.chip != nil {
		n.upd.Reseal = func() error {
			v := volume.Load()
			if v == nil {
				return errors.New("the data volume is not open yet")
			}
			if err := v.ResealNodeKey(n.keys); err != nil {
				return err
			}
			return enrol.Reseal()
		}
	}
	watchTrial(l, n.upd, func() { requestShutdown(reaper.ExitReboot) })
	sup = supervisor.New(ctx, logs, func(ctx context.Context) error {
		for _, r := range []struct {
			name string
			run  supervisor.Runnable
		}{
			{"power", power.WatchButton(func() { requestShutdown(reaper.ExitPowerOff) })},
			{"network", net.Run},
			{"enrolment", enrol.Run},
			{"roleserver", roles.Run},
		} {
			if err := supervisor.Run(ctx, r.name, r.run); err != nil {
				return err
			}
		}
		supervisor.Signal(ctx, supervisor.SignalHealthy)
		<-ctx.Done()
		return ctx.Err()
	}, supervisor.Options{})
	go reportReadiness(ctx, l, sup)
	go confirmWhenReady(ctx, l, sup, n.upd, n.disk.Disk)

	code, corrupt := waitForShutdownRequest(l, shutdown, n.imageBad)
	if corrupt != nil {
		l.Error("halting: the system image is corrupt; stopping all runnables")
	} else {
		l.Info("shutting down: stopping all runnables")
	}
	cancel()
	stopped := make(chan struct{})
	go func() { sup.Wait(); close(stopped) }()
	select {
	case <-stopped:
		l.Info("all runnables stopped")
	case <-time.After(15 * time.Second):
		l.Error("runnables still running after 15s, going down anyway", "still", notStopped(sup))
	}
	closeDataVolume(l, n.local)
	unix.Sync()
	if corrupt != nil {
		l.Error(imageHaltedMessage)
		return waitForPowerOff(logs)
	}
	l.Info("filesystems synced, handing over to PID 1", "action", map[int]string{reaper.ExitPowerOff: "power off", reaper.ExitReboot: "reboot"}[code])
	return code
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
// (measured) command line; verifySystemImage reads the rest. In a disk
// boot (plinth.slot= in the UKI's command line) the image is the slot's
// partition on the disk the UKI came from; otherwise it is the file in
// the initramfs. boot is that disk, also when the UKI came from a disk
// without naming a slot, nil when the node did not boot from a disk.
func openSystemImage(args map[string]string) (p verity.Params, r *sysimage.Result, boot *bootdisk.Boot, detail string, err error) {
	raw, ok := args["plinth.verity"]
	if !ok {
		return p, nil, nil, "", errors.New("no plinth.verity= on the kernel command line: refusing to use an unverified system image")
	}
	if p, err = verity.ParseParams(raw); err != nil {
		return p, nil, nil, "", err
	}
	slot := args[layout.SlotArg]
	if slot != "" && slot != "a" && slot != "b" {
		return p, nil, nil, "", fmt.Errorf("%s=%q on the kernel command line: want a or b", layout.SlotArg, slot)
	}
	if boot, err = findBootDisk(slot); err != nil {
		return p, nil, nil, "", err
	}
	source, where := "/"+layout.SystemImagePath, "the initramfs"
	if slot != "" {
		if source, _, err = boot.Slot(slot); err != nil {
			return p, nil, nil, "", err
		}
		where = "slot " + slot
	}
	if r, err = sysimage.Open(source, p); err != nil {
		return p, nil, nil, "", err
	}
	if err := sysimage.Mount(r.Device, "/newroot", "squashfs"); err != nil {
		// dm-verity refused a block the mount read: say which, and that
		// it is the image, not the node.
		if _, verr := sysimage.Verify(context.Background(), r.Device, r.Size, sysimage.Pace{Busy: 1}); errors.Is(verr, sysimage.ErrTampered) {
			return p, nil, nil, "", fmt.Errorf("the system image in %s does not match its root hash (tampered or corrupt; nothing else on the disk was touched): %w", where, verr)
		}
		return p, nil, nil, "", err
	}
	return p, r, boot, fmt.Sprintf("%s on %s (%s), %d MiB, root hash %x: every block is checked when read", r.Device, r.Loop, where, r.Size>>20, p.RootHash), nil
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

// verifySystemImage reads the whole system image in the background, so
// that a tampered block is found even if nothing reads it for a long time
// (dm-verity already refuses it to any reader). The returned channel
// receives if a block does not match: the core then stops everything and
// halts, as for a failed boot step. An error that says nothing about the
// image (it could not be opened for reading) is logged, not halted for.
func verifySystemImage(l *slog.Logger, r *sysimage.Result, p verity.Params) <-chan error {
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

func switchRoot() (string, error) {
	if err := mount.SwitchRoot("/newroot", layout.MovedMounts); err != nil {
		return "", err
	}
	// Container runtimes and kubelet rely on mount propagation from /.
	if err := unix.Mount("", "/", "", unix.MS_REC|unix.MS_SHARED, ""); err != nil {
		return "", fmt.Errorf("making / shared: %w", err)
	}
	if err := mount.All([]mount.Mount{
		{Source: "tmp", Target: layout.TmpMount, FSType: "tmpfs", Flags: unix.MS_NOSUID | unix.MS_NODEV, Data: "mode=1777"},
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

// setupCgroups mounts cgroup2 and moves the core into a leaf, so that
// controllers can be enabled for the workloads below the root.
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
