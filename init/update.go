package main

import (
	"context"
	"fmt"
	"log/slog"
	"os"
	"strings"
	"time"

	"plinth.dev/plinth/platform/bootdisk"
	"plinth.dev/plinth/platform/efivar"
	"plinth.dev/plinth/platform/layout"
	datadisk "plinth.dev/plinth/platform/storage"
	"plinth.dev/plinth/platform/supervisor"
	"plinth.dev/plinth/platform/update"
	"plinth.dev/plinth/platform/watchdog"
)

// The node's side of an A/B update (platform/update), step by step:
//
//	update state   (before the system image)  efivarfs: PlinthUpdate ─► normal / trial / rolled back (boot.updates)
//	system image   the slot's partition        ─► boot.bootDisk
//	measured boot  keys.Other = upd.Other      ─► keys open on either slot while an update is pending;
//	               describeSlot                ─► upd.Boot, Board, Events, SealPCRs, Current, ParametersDigest
//	running node   ─► upd.Reseal (node unlock key + join state, with the kept keys)
//	platform ready ─► upd.Healthy: a trial boot is confirmed; stale seals dropped
//	a failed step on a trial boot ─► reboot: the firmware boots the old slot (BootNext is spent)

// trialDeadline bounds a trial boot: not healthy by then (a crash loop, a
// cluster it cannot join), the node reboots into the old slot. Generous:
// a TCG boot with Kubernetes takes minutes.
const trialDeadline = 20 * time.Minute

// startUpdates reads the update state before anything else is mapped and
// settles it for this boot (update.Settle): this boot is normal, the
// trial of a new slot, or the old slot after an update failed.
func (b *boot) startUpdates() (string, error) {
	l := b.l
	slot := b.args[layout.SlotArg]
	n := &update.Node{Running: slot, Store: efivar.Store{Dir: efivar.Dir}, Log: l}
	b.updates = n
	if slot == "" || !bootdisk.UEFI() {
		return "no system slots (not booted from a flashed disk): updates are a new boot image", nil
	}
	if err := bootdisk.MountEFIVars(); err != nil {
		return "", err
	}
	kind, failed, err := n.Start(time.Now())
	if err != nil {
		// The boot goes on: a variable store that cannot be read or
		// written must not keep the node from running.
		l.Error("update state: the UEFI variable could not be read or written", "err", err)
		return "slot " + slot + ", update state unavailable", nil
	}
	switch kind {
	case update.BootTrial:
		st := n.Status()
		return fmt.Sprintf("slot %s: trial boot of version %s; it becomes permanent when the node is healthy, a failure boots the previous slot%s", slot, st.Pending.Version, armTrialWatchdog(l, n)), nil
	case update.BootRolledBack:
		l.Error("update failed", "version", failed.Version, "slot", failed.Slot, "reason", failed.Reason)
		return fmt.Sprintf("slot %s: the update to version %s FAILED (see above); this slot runs as before", slot, failed.Version), nil
	}
	if p := n.Status().Pending; p != nil {
		// Staged: kept across this boot until activated or cancelled.
		return fmt.Sprintf("slot %s; version %s is staged in slot %s: it boots when activated", slot, p.Version, p.To), nil
	}
	return "slot " + slot + ", no update pending", nil
}

// imageRelease reads the board and version of the running system image
// from its /etc/os-release (after the switch into it).
func imageRelease() (board, ver string) {
	b, err := os.ReadFile("/etc/os-release")
	if err != nil {
		return "", ""
	}
	for _, l := range strings.Split(string(b), "\n") {
		if v, ok := strings.CutPrefix(l, "VERSION_ID="); ok {
			ver = strings.Trim(v, `"`)
		}
		if v, ok := strings.CutPrefix(l, "PLINTH_BOARD="); ok {
			board = strings.Trim(v, `"`)
		}
	}
	return board, ver
}

// kubernetesServices is the supervisor subtree of the Kubernetes services
// (roleserver's "kubernetes" worker, its controller and worker below).
const kubernetesServices = "root.roleserver.kubernetes."

// platformReady reports whether every supervised runnable is healthy
// (or done), the Kubernetes services below kubernetesServices aside: that
// is when a trial boot is confirmed. The image has then booted, unsealed,
// joined the cluster (the heartbeat is healthy) and, on a consensus
// member, runs etcd and the curator. Kubernetes services wait for API
// servers, often on other nodes: a worker whose controllers are down or
// being updated would otherwise roll back a good image. A rolling update
// waits for the cluster's view of the node instead.
func platformReady(sts []supervisor.Status) bool {
	for _, st := range sts {
		if strings.HasPrefix(st.DN, kubernetesServices) {
			continue
		}
		if st.State != supervisor.StateHealthy && st.State != supervisor.StateDone {
			return false
		}
	}
	return len(sts) > 0
}

// confirmWhenReady waits until platformReady, then confirmWhenHealthy.
func confirmWhenReady(ctx context.Context, l *slog.Logger, sup *supervisor.Supervisor, upd *update.Node, disk string) {
	if upd == nil || upd.Boot == nil {
		return
	}
	for {
		ch := sup.Changed()
		if platformReady(sup.Snapshot()) {
			confirmWhenHealthy(l, upd, disk)
			return
		}
		select {
		case <-ch:
		case <-ctx.Done():
			return
		}
	}
}

// confirmWhenHealthy runs once the node is healthy: a trial boot becomes
// permanent, a key still sealed to a slot no boot should use is sealed
// again.
func confirmWhenHealthy(l *slog.Logger, upd *update.Node, disk string) {
	if upd == nil || upd.Boot == nil {
		return
	}
	trial := upd.Kind() == update.BootTrial
	sealed, err := datadisk.SealedKey(disk)
	if err != nil {
		l.Error("update: reading the sealed key", "err", err)
		return
	}
	resealed, err := upd.Healthy(sealed)
	switch {
	case err != nil:
		l.Error("update: confirming this slot failed; the next reset boots it as a trial again", "err", err)
	case trial:
		l.Info("update confirmed: this slot is permanent, the keys open with its PCRs alone", "slot", upd.Running)
	case resealed:
		l.Info("update: keys sealed to this slot alone again (an update failed or was confirmed before)")
	}
}

// trialWatchdogTimeout is the watchdog's timeout on a trial boot: the core
// pets it every quarter of that.
const trialWatchdogTimeout = 30 * time.Second

// trialShutdownGrace is how long after trialDeadline the watchdog is still
// petted: watchTrial's clean reboot (runnables stopped, data volume
// closed) comes first, the reset only if that hangs too.
const trialShutdownGrace = time.Minute

// armTrialWatchdog arms the watchdog for a trial boot and pets it until the
// update is confirmed (then disarms it) or the trial deadline and its
// shutdown grace passed (then stops petting: the machine resets, even if
// the core is stuck). A core
// that hangs or dies stops petting too. It returns what it did, for the
// boot step's line.
func armTrialWatchdog(l *slog.Logger, upd *update.Node) string {
	w, err := watchdog.Open(trialWatchdogTimeout)
	if err != nil {
		l.Warn("trial boot without a watchdog: a hang needs a reset by hand", "err", err)
		return "; no watchdog"
	}
	start := time.Now()
	go func() {
		t := time.NewTicker(w.Timeout / 4)
		defer t.Stop()
		for range t.C {
			switch {
			case upd.Kind() != update.BootTrial:
				if err := w.Disarm(); err != nil {
					l.Error("disarming the watchdog", "err", err)
				}
				return
			case time.Since(start) > trialDeadline+trialShutdownGrace:
				// watchTrial asked for a clean reboot at the deadline;
				// still here, the shutdown is stuck too.
				l.Error("trial boot still running " + trialShutdownGrace.String() + " after its deadline: the watchdog resets the machine into the previous slot")
				return
			}
			w.Pet()
		}
	}()
	return fmt.Sprintf("; watchdog (%s) armed, %v", w.Identity, w.Timeout)
}

// watchTrial reboots a trial boot that is not healthy by trialDeadline.
func watchTrial(l *slog.Logger, upd *update.Node, reboot func()) {
	if upd == nil || upd.Kind() != update.BootTrial {
		return
	}
	time.AfterFunc(trialDeadline, func() {
		if upd.Kind() == update.BootTrial {
			l.Error("trial boot not healthy after " + trialDeadline.String() + ": rebooting into the previous slot")
			reboot()
		}
	})
}
