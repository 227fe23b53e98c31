package board

func init() {
	register(&Board{
		Name:          "qemu-x86_64",
		KernelPackage: "linux-image-6.1.0-57-cloud-amd64",
		EarlyModules: []string{
			// disks, network, entropy
			"virtio_pci", "virtio_blk", "virtio_net", "virtio_rng",
			// the system image: a file in the initramfs behind dm-verity
			"loop", "dm_verity", "squashfs",
			// storage (next to the system image: the data disk)
			"dm_crypt", "dm_integrity",
			// node parameters from QEMU, ACPI power button
			"qemu_fw_cfg", "button", "evdev",
		},
		SystemModules: []string{
			"overlay", "xfs", "vfat", "efivarfs",
			"bridge", "br_netfilter", "veth", "vxlan", "nf_tables", "wireguard",
		},
		Console: "ttyS0",
		// panic=-1: a kernel panic reboots at once instead of hanging a
		// test; loglevel=4 keeps kernel warnings and errors on the console.
		Cmdline: []string{"panic=-1", "loglevel=4"},
		QEMU:    QEMU{Machine: "q35", MemoryMiB: 2048, CPUs: 2},
	})
}
