package update

import (
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"sync"
	"time"

	"golang.org/x/sys/unix"

	"plinth.dev/plinth/platform/bootdisk"
	"plinth.dev/plinth/platform/efivar"
	"plinth.dev/plinth/platform/eventlog"
	"plinth.dev/plinth/platform/layout"
	"plinth.dev/plinth/platform/measure"
)

// Errors an update is refused with; callers decide on them (errors.Is).
var (
	// ErrNoSlots: the node did not boot from a flashed disk.
	ErrNoSlots = errors.New("update: this node did not boot from a flashed disk and has no system slots (a network boot): boot it from the new image's network-boot UKI instead")
	// ErrBusy: an update of this node is running, pending or on trial.
	ErrBusy = errors.New("update: another update of this node is running or pending")
	// ErrRejected: the image or the stream does not match its manifest,
	// or is not for this node. Nothing was booted from it.
	ErrRejected = errors.New("update: image refused")
)

// Node is one node's side of its A/B updates: the state in the UEFI
// variable, what this boot is, and the slot an update writes.
type Node struct {
	// Boot is the flashed disk the node booted from; nil for a network
	// boot (updates are refused).
	Boot *bootdisk.Boot
	// Running is the slot this boot runs ("" with Boot nil).
	Running string
	Board   string
	Store   efivar.Store
	Log     *slog.Logger
	// OSRelease is the running image's os-release, whose PLINTH_RELEASE
	// is the release an update may not go below (CheckRelease); ""
	// means layout.OSReleasePath. Read at each Begin: the system image
	// is mounted only after the Node is made.
	OSRelease string

	// What the node's keys are sealed to this boot, and what a boot of
	// the new slot will measure (Predict): this boot's PCR values as
	// unsealed (Current) for the PCRs in SealPCRs, the firmware's event
	// log and the node parameters' digest.
	SealPCRs         []int
	Current          map[int][]byte
	Events           []eventlog.Event
	ParametersDigest [32]byte
	// Reseal seals every key the node keeps sealed (node unlock key, join
	// state) again: to this boot's PCRs and, while Other returns a set, to
	// it too. nil: the node keeps no sealed keys (no TPM).
	Reseal func() error
	// PCRSets is the file on the encrypted data volume that keeps a
	// pending update's PCR values (sealsets.go); it exists only once the
	// volume is open.
	PCRSets string

	mu    sync.Mutex
	state State
	boot  Boot
	busy  bool
}

// Start reads the state and settles it for this boot (Settle), storing
// the result. A corrupt variable is reported and replaced. It returns what
// this boot is and, when an update failed, why.
func (n *Node) Start(now time.Time) (Boot, *Failure, error) {
	st, err := Read(n.Store)
	if errors.Is(err, ErrCorruptState) {
		n.Log.Error("update state unreadable; treating it as no update pending", "err", err)
	} else if err != nil {
		return BootNormal, nil, err
	}
	next, boot := Settle(st, n.Running, now)
	n.mu.Lock()
	n.state, n.boot = next, boot
	n.mu.Unlock()
	if boot == BootRolledBack || err != nil {
		if err := Write(n.Store, next); err != nil {
			return boot, next.LastFailed, err
		}
	}
	if boot == BootRolledBack {
		return boot, next.LastFailed, nil
	}
	return boot, nil, nil
}

// Kind is what this boot is (Start decided it).
func (n *Node) Kind() Boot {
	n.mu.Lock()
	defer n.mu.Unlock()
	return n.boot
}

// Other returns the PCR values the node's keys must also open with now:
// the new slot's while an update is installed, the old slot's during the
// trial boot; nil otherwise. measure.TPMKeys.Other calls it. The values
// come from the data volume (keptPCRs), never from the variable.
func (n *Node) Other() map[int][]byte {
	n.mu.Lock()
	p := n.state.Pending
	n.mu.Unlock()
	if p == nil {
		return nil
	}
	slot := p.To
	if n.Running == p.To {
		slot = p.From
	}
	return n.keptPCRs(p, slot)
}

// Snapshot is the node's update status.
type Snapshot struct {
	Slot, Board string
	// Pending is the update in progress; its Phase is "trial" on the
	// trial boot.
	Pending    *Pending
	LastFailed *Failure
}

// Status returns the update status (the zero Snapshot for a boot
// without slots).
func (n *Node) Status() Snapshot {
	n.mu.Lock()
	defer n.mu.Unlock()
	if n.Running == "" {
		return Snapshot{}
	}
	s := Snapshot{Slot: n.Running, Board: n.Board, LastFailed: n.state.LastFailed}
	if p := n.state.Pending; p != nil {
		c := *p
		if n.boot == BootTrial {
			c.Phase = "trial"
		}
		s.Pending = &c
	}
	return s
}

// Healthy runs when the node is healthy (back in its cluster): a trial
// boot is confirmed (Confirm); otherwise, if the sealed node unlock key
// still opens with a PCR set no boot should use any more (an update
// failed, or a crash came between a confirmation and the reseal), the
// keys are sealed to this boot alone. resealed says whether that
// happened.
func (n *Node) Healthy(sealedKey []byte) (resealed bool, err error) {
	n.mu.Lock()
	boot, pending := n.boot, n.state.Pending
	n.mu.Unlock()
	if boot == BootTrial {
		return true, n.Confirm()
	}
	if pending != nil || measure.Alternatives(sealedKey) < 2 || n.Reseal == nil {
		return false, nil
	}
	return true, n.Reseal()
}

// Confirm makes the trial boot's slot permanent: first in the firmware's
// boot order and the fallback boot file, the keys sealed to this boot
// alone, the state cleared. Each step may be repeated: a crash in between
// makes the next boot a trial again, which confirms again.
func (n *Node) Confirm() error {
	n.mu.Lock()
	if n.boot != BootTrial {
		n.mu.Unlock()
		return nil
	}
	st := n.state
	n.mu.Unlock()
	e := Entries{Store: n.Store, ESP: n.Boot.ESP}
	if err := e.MakeDefault(n.Running); err != nil {
		return fmt.Errorf("boot order: %w", err)
	}
	if err := n.withESP(func(dir string) error {
		return copyFileAtomic(filepath.Join(dir, layout.ESPSlotUKI(n.Running)), filepath.Join(dir, layout.ESPBootFile))
	}); err != nil {
		return fmt.Errorf("fallback boot file: %w", err)
	}
	next := Confirm(st)
	n.mu.Lock()
	n.state, n.boot = next, BootNormal
	n.mu.Unlock()
	if n.Reseal != nil {
		if err := n.Reseal(); err != nil {
			return fmt.Errorf("sealing the keys to this slot alone: %w", err)
		}
	}
	return Write(n.Store, next)
}

// espUpdateMount is where the ESP is mounted read-write while an update
// writes to it.
const espUpdateMount = "/run/plinth/esp-update"

// withESP mounts the boot disk's ESP read-write for fn.
func (n *Node) withESP(fn func(dir string) error) error {
	if err := os.MkdirAll(espUpdateMount, 0o700); err != nil {
		return err
	}
	if err := unix.Mount(n.Boot.ESPDevice(), espUpdateMount, "vfat", unix.MS_NOSUID|unix.MS_NODEV|unix.MS_NOEXEC, "flush"); err != nil {
		return fmt.Errorf("mounting the ESP %s: %w", n.Boot.ESPDevice(), err)
	}
	err := fn(espUpdateMount)
	if uerr := unix.Unmount(espUpdateMount, 0); err == nil && uerr != nil {
		err = fmt.Errorf("unmounting the ESP: %w", uerr)
	}
	return err
}

// copyFileAtomic copies src to dst through a temporary file, synced and
// renamed into place: FAT has no atomic rename, but the old file stays
// whole until the new one is complete on the disk.
func copyFileAtomic(src, dst string) error {
	data, err := os.ReadFile(src)
	if err != nil {
		return err
	}
	return writeFileAtomic(dst, data)
}

func writeFileAtomic(dst string, data []byte) error {
	if err := os.MkdirAll(filepath.Dir(dst), 0o755); err != nil {
		return err
	}
	tmp := dst + ".new"
	f, err := os.OpenFile(tmp, os.O_WRONLY|os.O_CREATE|os.O_TRUNC, 0o644)
	if err != nil {
		return err
	}
	if _, err := f.Write(data); err != nil {
		f.Close()
		return err
	}
	if err := f.Sync(); err != nil {
		f.Close()
		return err
	}
	if err := f.Close(); err != nil {
		return err
	}
	if err := os.Rename(tmp, dst); err != nil {
		return err
	}
	d, err := os.Open(filepath.Dir(dst))
	if err != nil {
		return err
	}
	defer d.Close()
	return d.Sync()
}

// hexPCRs is a PCR set as the state keeps it.
func hexPCRs(v map[int][]byte) map[int]string {
	out := make(map[int]string, len(v))
	for k, b := range v {
		out[k] = hex.EncodeToString(b)
	}
	return out
}

// setState replaces the state in memory and in the variable; without a
// pending update, the data volume keeps no PCR values either.
func (n *Node) setState(st State) error {
	n.mu.Lock()
	n.state = st
	n.mu.Unlock()
	if st.Pending == nil {
		n.dropPCRs()
	}
	return Write(n.Store, st)
}

func (n *Node) currentState() State {
	n.mu.Lock()
	defer n.mu.Unlock()
	st := n.state
	if st.Pending != nil {
		p := *st.Pending
		st.Pending = &p
	}
	return st
}
