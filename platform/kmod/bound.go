package kmod

import (
	"os"
	"path/filepath"
	"sort"
	"strings"
)

// Bound is a device and the drivers that drive it, nearest first: sda
// ["sd", "ahci"], vda ["virtio_blk", "virtio-pci"], eth0 ["e1000e"].
type Bound struct {
	Name    string
	Drivers []string
}

func (b Bound) String() string {
	if len(b.Drivers) == 0 {
		return b.Name + " (no driver)"
	}
	return b.Name + " (" + strings.Join(b.Drivers, ", ") + ")"
}

// BoundDevices lists the entries of a sysfs class directory (e.g.
// /sys/class/net, /sys/block) that keep passes, each with the drivers
// bound to its device and the device's ancestors up to sysfs/devices.
// It tells the user of a new machine which of its hardware the board's
// modules cover.
func BoundDevices(sysfs, class string, keep func(name string) bool) []Bound {
	entries, err := os.ReadDir(filepath.Join(sysfs, class))
	if err != nil {
		return nil
	}
	devices := filepath.Join(sysfs, "devices")
	var out []Bound
	for _, e := range entries {
		if keep != nil && !keep(e.Name()) {
			continue
		}
		b := Bound{Name: e.Name()}
		dev, err := filepath.EvalSymlinks(filepath.Join(sysfs, class, e.Name(), "device"))
		for err == nil && strings.HasPrefix(dev, devices+"/") {
			if d, err := os.Readlink(filepath.Join(dev, "driver")); err == nil {
				if name := filepath.Base(d); len(b.Drivers) == 0 || b.Drivers[len(b.Drivers)-1] != name {
					b.Drivers = append(b.Drivers, name)
				}
			}
			dev = filepath.Dir(dev)
		}
		out = append(out, b)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Name < out[j].Name })
	return out
}
