package update

import (
	"errors"
	"fmt"
	"slices"
	"strings"

	"plinth.dev/plinth/platform/efivar"
	"plinth.dev/plinth/platform/gpt"
	"plinth.dev/plinth/platform/layout"
)

// Entries are the firmware boot entries of a disk's slots: "Plinth a" and
// "Plinth b", each the ESP partition (by its GUID) and the slot's UKI. The
// image's EFI/BOOT/BOOTX64.EFI is the firmware's fallback when no entry
// works (a fresh disk, or firmware that lost its variables).
type Entries struct {
	Store efivar.Store
	ESP   gpt.Partition
}

// description names slot's entry in the firmware's boot menu.
func description(slot string) string { return "Plinth " + slot }

func (e Entries) option(slot string) efivar.LoadOption {
	hd := efivar.HardDrive{Number: uint32(e.ESP.Number), StartLBA: e.ESP.FirstLBA, Sizes: e.ESP.LastLBA - e.ESP.FirstLBA + 1, GUID: e.ESP.ID}
	return efivar.LoadOption{Attributes: efivar.LoadOptionActive, Description: description(slot),
		FilePath: efivar.BootPath(hd, `\`+strings.ReplaceAll(layout.ESPSlotUKI(slot), "/", `\`))}
}

// find returns the number of slot's entry: one that boots the slot's UKI
// from this ESP, whatever its description.
func (e Entries) find(entries map[uint16]efivar.LoadOption, slot string) (uint16, bool) {
	want := e.option(slot)
	wantHD, wantFile, _ := efivar.ParseBootPath(want.FilePath)
	for _, n := range efivar.SortedNumbers(entries) {
		hd, file, ok := efivar.ParseBootPath(entries[n].FilePath)
		if ok && hd.GUID == wantHD.GUID && strings.EqualFold(file, wantFile) {
			return n, true
		}
	}
	return 0, false
}

// Ensure returns the number of slot's entry, creating it (or rewriting
// one that points at the right file with other attributes or data).
func (e Entries) Ensure(slot string) (uint16, error) {
	entries, err := e.Store.BootEntries()
	if err != nil {
		return 0, err
	}
	want := e.option(slot)
	n, ok := e.find(entries, slot)
	if ok && slices.Equal(entries[n].Marshal(), want.Marshal()) {
		return n, nil
	}
	if !ok {
		if n, err = efivar.FreeBootNumber(entries); err != nil {
			return 0, err
		}
	}
	if err := e.Store.SetBootEntry(n, want); err != nil {
		return 0, fmt.Errorf("boot entry %q: %w", want.Description, err)
	}
	return n, nil
}

// BootOnce makes the next boot, and only that one, boot slot.
func (e Entries) BootOnce(slot string) (uint16, error) {
	n, err := e.Ensure(slot)
	if err != nil {
		return 0, err
	}
	return n, e.Store.SetBootNext(n)
}

// MakeDefault puts slot's entry first in BootOrder and takes the other
// slot's out of it (its keys no longer open: booting it would only halt),
// keeping the firmware's own entries after it.
func (e Entries) MakeDefault(slot string) error {
	n, err := e.Ensure(slot)
	if err != nil {
		return err
	}
	entries, err := e.Store.BootEntries()
	if err != nil {
		return err
	}
	other, hasOther := e.find(entries, Other(slot))
	order, err := e.Store.BootOrder()
	if err != nil && !errors.Is(err, efivar.ErrNotFound) {
		return err
	}
	next := []uint16{n}
	for _, x := range order {
		if x != n && (!hasOther || x != other) {
			next = append(next, x)
		}
	}
	if slices.Equal(next, order) {
		return nil
	}
	return e.Store.SetBootOrder(next)
}

// CancelBootOnce deletes BootNext if it names slot's entry (an update that
// is abandoned before its reboot).
func (e Entries) CancelBootOnce(slot string) error {
	next, err := e.Store.BootNext()
	if errors.Is(err, efivar.ErrNotFound) {
		return nil
	}
	if err != nil {
		return err
	}
	entries, err := e.Store.BootEntries()
	if err != nil {
		return err
	}
	if n, ok := e.find(entries, slot); ok && n == next {
		return e.Store.ClearBootNext()
	}
	return nil
}
