package update

import (
	"errors"
	"fmt"
)

// ErrNotStaged: Activate or Cancel found no installed update (of the
// version asked for) that waits for its first boot.
var ErrNotStaged = errors.New("update: no installed update waits to be booted")

// Activate makes the firmware boot the staged update of version (any
// version if empty) once, at the next reboot: its boot entry, BootNext,
// and the state "ready". Activating an update that is ready already
// changes nothing. It returns the update.
//
// Why staging is a step of its own: writing and checking the slot takes
// a while and disturbs nothing, booting it takes the node away. An
// operator stages an update on many nodes at once and activates them one
// at a time (a rolling update installs the next node while the previous
// one reboots).
func (n *Node) Activate(version string) (Pending, error) {
	if err := n.reserveWaiting(version); err != nil {
		return Pending{}, err
	}
	defer n.release()
	return n.activate()
}

// Activate activates the update the session installed (Node.Activate),
// before another can begin.
func (s *Session) Activate() (Pending, error) { return s.n.activate() }

func (n *Node) activate() (Pending, error) {
	st := n.currentState()
	if st.Pending == nil || st.Pending.Phase == PhaseWriting {
		return Pending{}, ErrNotStaged
	}
	e := Entries{Store: n.Store, ESP: n.Boot.ESP}
	if _, err := e.BootOnce(st.Pending.To); err != nil {
		return Pending{}, fmt.Errorf("boot entry: %w", err)
	}
	ready := *st.Pending
	ready.Phase = PhaseReady
	st.Pending = &ready
	if err := n.setState(st); err != nil {
		return Pending{}, err
	}
	n.Log.Info("update activated: the next boot tries it once", "version", ready.Version, "slot", ready.To)
	return ready, nil
}

// Cancel abandons the staged or ready update of version (any version if
// empty) before its slot was booted: nothing boots the slot (BootNext
// cleared), the state is cleared, and the keys are sealed to the running
// slot alone. It is no failure: the status keeps the last failed update
// it had. A trial boot cannot be cancelled; it ends when the node is
// healthy (Confirm) or reset.
func (n *Node) Cancel(version string) (Pending, error) {
	if err := n.reserveWaiting(version); err != nil {
		return Pending{}, err
	}
	defer n.release()
	return n.cancel()
}

// Cancel cancels the update the session installed (Node.Cancel).
func (s *Session) Cancel() (Pending, error) { return s.n.cancel() }

func (n *Node) cancel() (Pending, error) {
	st := n.currentState()
	if st.Pending == nil {
		return Pending{}, ErrNotStaged
	}
	p := *st.Pending
	e := Entries{Store: n.Store, ESP: n.Boot.ESP}
	if err := e.CancelBootOnce(p.To); err != nil {
		return Pending{}, fmt.Errorf("clearing BootNext: %w", err)
	}
	if err := n.setState(State{LastFailed: st.LastFailed, LastVersion: st.LastVersion}); err != nil {
		return Pending{}, err
	}
	// A crash before this reseal leaves keys that also open with the
	// slot's PCRs; Healthy drops them at the next boot.
	if n.Reseal != nil {
		if err := n.Reseal(); err != nil {
			return Pending{}, fmt.Errorf("sealing the keys to this slot alone: %w", err)
		}
	}
	n.Log.Info("update cancelled", "version", p.Version, "slot", p.To)
	return p, nil
}

// reserveWaiting checks that an update of version (any if empty) is
// installed and not yet booted, and holds the node as Begin does until
// release.
func (n *Node) reserveWaiting(version string) error {
	if n.Boot == nil || n.Running == "" {
		return ErrNoSlots
	}
	n.mu.Lock()
	defer n.mu.Unlock()
	p := n.state.Pending
	switch {
	case n.busy:
		return fmt.Errorf("%w: an update is being installed", ErrBusy)
	case n.boot == BootTrial && p != nil:
		return fmt.Errorf("%w: this boot is the trial of version %s; it becomes permanent once the node is healthy", ErrBusy, p.Version)
	case p == nil || p.Phase == PhaseWriting:
		return ErrNotStaged
	case version != "" && p.Version != version:
		return fmt.Errorf("%w: version %s is installed, not %s", ErrNotStaged, p.Version, version)
	}
	n.busy = true
	return nil
}

func (n *Node) release() {
	n.mu.Lock()
	n.busy = false
	n.mu.Unlock()
}
