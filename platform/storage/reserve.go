package storage

import (
	"fmt"
	"log/slog"
	"time"
)

// Reserve keeps enrolment data in the data disk's header before the
// volume exists, for a node that must remember something across a reboot
// before it can set its volume up: a registering node's keys while it
// waits for the owner's approval (it cannot make its volume key before
// the cluster hands it the cluster unlock key).
//
// A blank disk gets its partition table and an initialising header that
// carries enrolment and no sealed key; a disk whose first-time setup never
// finished gets its header's enrolment replaced. A disk that is set up is
// refused. Open later sets the volume up as for any interrupted setup,
// writing the enrolment of its own Config.
func Reserve(c Config, enrolment []byte) error {
	if c.Log == nil {
		c.Log = slog.New(slog.DiscardHandler)
	}
	o := &opener{Config: c, res: &Result{}}
	if err := o.findDisk(); err != nil {
		return err
	}
	prev, err := o.readLayout()
	if err != nil {
		return err
	}
	if prev != nil && prev.State == StateReady {
		return fmt.Errorf("%w: the data disk is set up already", ErrRefused)
	}
	if o.res.Partition == "" {
		if err := o.partition(); err != nil {
			return err
		}
	}
	h := &Header{Version: HeaderVersion, State: StateInitialising, Mode: o.Mode, Filesystem: o.Filesystem,
		PartitionID: o.part.ID, KeyPolicy: o.policy(), Enrolment: enrolment}
	if prev != nil {
		h.Sequence, h.Created = prev.Sequence, prev.Created
	} else {
		h.Created = uint64(time.Now().Unix())
	}
	return o.writeHeader(h)
}
