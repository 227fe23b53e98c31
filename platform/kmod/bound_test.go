package kmod

import (
	"os"
	"path/filepath"
	"slices"
	"testing"
)

// TestBoundDevices on a sysfs tree shaped like a q35 machine's: a SATA
// disk behind ahci, a virtio disk, an e1000e NIC, a NIC without driver.
func TestBoundDevices(t *testing.T) {
	sys := t.TempDir()
	mk := func(dir string) {
		if err := os.MkdirAll(filepath.Join(sys, dir), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	link := func(target, name string) {
		mk(filepath.Dir(name))
		if err := os.Symlink(filepath.Join(sys, target), filepath.Join(sys, name)); err != nil {
			t.Fatal(err)
		}
	}
	for _, d := range []string{"bus/pci/drivers/ahci", "bus/scsi/drivers/sd", "bus/virtio/drivers/virtio_blk",
		"bus/pci/drivers/virtio-pci", "bus/pci/drivers/e1000e"} {
		mk(d)
	}
	ahci := "devices/pci0000:00/0000:00:1f.2"
	sda := ahci + "/ata1/host0/target0:0:0/0:0:0:0"
	vpci := "devices/pci0000:00/0000:00:04.0"
	vda := vpci + "/virtio2"
	nic := "devices/pci0000:00/0000:00:02.0"
	bare := "devices/pci0000:00/0000:00:03.0"
	for _, d := range []string{sda, vda, nic, bare} {
		mk(d)
	}
	link("bus/pci/drivers/ahci", ahci+"/driver")
	link("bus/scsi/drivers/sd", sda+"/driver")
	link("bus/pci/drivers/virtio-pci", vpci+"/driver")
	link("bus/virtio/drivers/virtio_blk", vda+"/driver")
	link("bus/pci/drivers/e1000e", nic+"/driver")
	link(sda, "block/sda/device")
	link(vda, "block/vda/device")
	mk("block/loop0") // no device: listed, no driver
	link(nic, "class/net/eth0/device")
	link(bare, "class/net/eth1/device")
	mk("class/net/lo")

	disks := BoundDevices(sys, "block", nil)
	want := []string{"loop0 (no driver)", "sda (sd, ahci)", "vda (virtio_blk, virtio-pci)"}
	if got := strs(disks); !slices.Equal(got, want) {
		t.Errorf("disks %q, want %q", got, want)
	}
	nics := BoundDevices(sys, "class/net", func(n string) bool { return n != "lo" })
	want = []string{"eth0 (e1000e)", "eth1 (no driver)"}
	if got := strs(nics); !slices.Equal(got, want) {
		t.Errorf("network %q, want %q", got, want)
	}
	if BoundDevices(sys, "class/none", nil) != nil {
		t.Error("a missing class directory lists devices")
	}
}

func strs(b []Bound) []string {
	var out []string
	for _, x := range b {
		out = append(out, x.String())
	}
	return out
}
