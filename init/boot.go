package main

import (
	"fmt"
	"log/slog"
	"time"

	"golang.org/x/sys/unix"

	"plinth.dev/plinth/platform/bootdisk"
	"plinth.dev/plinth/platform/cmdline"
	"plinth.dev/plinth/platform/eventlog"
	"plinth.dev/plinth/platform/logtree"
	"plinth.dev/plinth/platform/measure"
	"plinth.dev/plinth/platform/mount"
	"plinth.dev/plinth/platform/reaper"
	datadisk "plinth.dev/plinth/platform/storage"
	"plinth.dev/plinth/platform/sysimage"
	"plinth.dev/plinth/platform/tpm"
	"plinth.dev/plinth/platform/update"
	"plinth.dev/plinth/platform/verity"
	"plinth.dev/plinth/roleserver/localstorage"
	"plinth.dev/plinth/roleserver/parameters"
)

// boot is one boot of the core, from the first mount to the hand-over to
// the supervised node (runNode). Its steps run in order (steps); each is
// a method that reads what earlier steps set and sets its own fields. A
// field's comment names the step that sets it, so what a step gets and
// gives is this type.
//
// Why one record: the steps used to share a dozen locals of one long
// function, some set in one closure and read three closures later, and
// what an A/B update needs to know about the running slot was filled in
// at five places.
type boot struct {
	// Set by newBoot, before the first step.
	logs *logtree.Tree
	l    *slog.Logger
	// local is the node's storage tree: placed (its paths set) by "open
	// data disk", its data volume mounted there or by enrolment.
	local *localstorage.Root
	// version is the build's (main.version) until "switch root" reads
	// the running image's.
	version string

	// "early mounts": the (measured) kernel command line.
	args map[string]string

	// "A/B update state": this boot's side of A/B updates, settled before
	// the system image is mapped: a normal boot, the trial of an update
	// or the old slot after a failed one. The failure path asks it
	// whether this is a trial; a trial's watchdog and the TPM step's keys
	// hold it from here on. What it knows of the running slot is filled
	// in once, after "TPM and measured boot" (describeSlot); the running
	// node adds Reseal.
	updates *update.Node

	// "map and mount the system image (dm-verity)": the root hash and
	// the rest of the verity parameters, the mapped image, and the
	// flashed disk the node booted from (nil if none).
	system   verity.Params
	image    *sysimage.Result
	bootDisk *bootdisk.Boot

	// "switch root into the system image": the image's board (and its
	// version, above), "" if its os-release names none.
	board string

	// "verify the whole system image in the background": receives if a
	// block does not match the root hash (see watchSystemImage).
	imageBad <-chan error

	// "read node parameters": what this node is for; registering says
	// the volume opens only after the cluster hands over its key.
	params      *parameters.Loaded
	registering bool

	// "TPM and measured boot": what the firmware measured this boot and
	// its event log, the TPM (nil when not used), the node's key
	// protector and what its keys are sealed to.
	firmware measure.Firmware
	events   []eventlog.Event
	chip     *tpm.TPM
	keys     datadisk.KeyProtector
	sealed   sealedTo

	// "open data disk": the data disk chosen once for this boot (enrolment
	// uses the same), and its volume if init opened it (a registering
	// node's is opened by enrolment).
	disk   datadisk.Config
	volume *datadisk.Result
}

// sealedTo is what the node's keys are sealed to this boot: the PCRs,
// their values as unsealed, the node parameters' digest. Zero when no TPM
// is used.
type sealedTo struct {
	pcrs       []int
	current    map[int][]byte
	parameters [32]byte
}

func newBoot(logs *logtree.Tree) *boot {
	// The local storage tree's paths are fixed: placed now, the steps
	// before the data volume opens know where its files will be.
	local := &localstorage.Root{}
	if err := localstorage.Place(local, "/"); err != nil {
		panic(err)
	}
	return &boot{logs: logs, l: logs.Logger("init"), local: local, version: version}
}

// step is one boot step: its name is the console line's message.
type step struct {
	name string
	run  func() (detail string, err error)
}

// steps is the boot, in order.
func (b *boot) steps() []step {
	return []step{
		{"early mounts", b.earlyMounts},
		// Before the core starts anything: what it starts inherits it.
		{"timer slack", b.setTimerSlack},
		{"load early kernel modules", loadModules},
		// Before the system image: a trial boot that fails from here on
		// reboots into the previous slot.
		{"A/B update state", b.startUpdates},
		{"map and mount the system image (dm-verity)", b.openSystemImage},
		{"switch root into the system image", b.switchRoot},
		// cgroup2 before the background read: moving the core and
		// enabling the controllers happen before that reader has I/O in
		// flight (both vCPUs once locked up in init's threads in the
		// kernel right after it started, where this step came next).
		{"cgroup2", setupCgroups},
		{"verify the whole system image in the background", b.verifySystemImage},
		// What this node is for. Without valid parameters it waits:
		// nothing below may touch the disk on a guess.
		{"read node parameters", b.readParameters},
		{"TPM and measured boot", b.measureBoot},
		// Which disk is chosen here, once; enrolment uses the same one.
		{"open data disk", b.openDataDisk},
	}
}

// run runs the steps. Each logs what it did and how long it took. A
// failed step leaves the node waiting, saying why, and still answering a
// power-off request: no silent hang, no reboot loop (a trial boot reboots
// into the previous slot instead). ok is false when the boot ended; code
// is then PID 1's exit code.
func (b *boot) run() (code int, ok bool) {
	for _, s := range b.steps() {
		t := time.Now()
		detail, err := s.run()
		if err != nil {
			return b.stepFailed(s.name, err), false
		}
		b.l.Info(s.name, "detail", detail, "took", time.Since(t))
		select {
		case <-b.imageBad:
			return b.imageCorrupt(), false
		default:
		}
	}
	return 0, true
}

// stepFailed ends a boot whose step failed.
func (b *boot) stepFailed(name string, err error) int {
	b.l.Error("boot step failed: "+name, "err", err)
	if b.updates != nil && b.updates.Kind() == update.BootTrial {
		closeDataVolume(b.l, b.local)
		unix.Sync()
		b.l.Error("trial boot of an update failed: rebooting into the previous slot")
		b.l.Info("filesystems synced, handing over to PID 1", "action", "reboot")
		return reaper.ExitReboot
	}
	b.l.Error("node halted: the boot cannot continue; power the node off, fix the cause and boot again")
	return waitForPowerOff(b.logs)
}

// imageCorrupt ends a boot whose system image failed verification.
func (b *boot) imageCorrupt() int {
	closeDataVolume(b.l, b.local)
	unix.Sync()
	b.l.Error(imageHaltedMessage)
	return waitForPowerOff(b.logs)
}

// earlyMounts mounts what the core needs besides /proc, /sys and /dev
// (PID 1's), makes /dev's compulsory links (devtmpfs has none; switching
// root moves /dev with them) and reads the kernel command line.
func (b *boot) earlyMounts() (detail string, err error) {
	if err := mount.All(runtimeMounts); err != nil {
		return "", err
	}
	if err := mount.MakeDevLinks("/dev"); err != nil {
		return "", err
	}
	b.args, err = cmdline.Read()
	return "devpts, shm, run; /dev/fd, stdin, stdout, stderr", err
}

// switchRoot moves into the system image and reads its board and version.
func (b *boot) switchRoot() (string, error) {
	detail, err := enterSystemImage()
	if board, v := imageRelease(); v != "" {
		b.board, b.version = board, v
		detail += fmt.Sprintf("; image version %s for board %s", v, board)
	}
	return detail, err
}

// verifySystemImage starts reading the whole system image in the
// background (watchSystemImage).
func (b *boot) verifySystemImage() (string, error) {
	b.imageBad = watchSystemImage(b.l, b.image, b.system)
	return fmt.Sprintf("%d MiB, reading %.0f%% of the time", b.image.Size>>20, systemImagePace.Busy*100), nil
}

// describeSlot tells the update side, once, what the steps up to the
// TPM learnt about the running slot: the disk it booted from, the board,
// and what the keys are sealed to (which a new slot's boot must
// measure). Before this, the update.Node only says what this boot is.
func (b *boot) describeSlot() {
	u := b.updates
	u.Boot, u.Board, u.Events = b.bootDisk, b.board, b.events
	u.SealPCRs, u.Current, u.ParametersDigest = b.sealed.pcrs, b.sealed.current, b.sealed.parameters
	u.PCRSets = b.local.Data.Node.UpdatePCRs.Path()
}
