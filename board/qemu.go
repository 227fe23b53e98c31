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
			// the data disk: dm-crypt, dm-integrity and their ciphers (the
			// kernel cannot load these on demand: there is no modprobe)
			"dm_crypt", "dm_integrity", "xts", "ecb", "authenc", "aesni_intel",
			// node parameters from QEMU, ACPI power button
			"qemu_fw_cfg", "button", "evdev",
		},
		SystemModules: []string{
			"overlay", "xfs", "vfat", "efivarfs",
			"bridge", "br_netfilter", "veth", "vxlan", "nf_tables", "wireguard",
		},
		HostFiles: mkfsTools,
		Console:   "ttyS0",
		// panic=-1: a kernel panic reboots at once instead of hanging a
		// test; loglevel=4 keeps kernel warnings and errors on the console.
		Cmdline: []string{"panic=-1", "loglevel=4"},
		QEMU:    QEMU{Machine: "q35", MemoryMiB: 2048, CPUs: 2},
	})
}

// mkfsTools are the filesystem creators the storage service runs
// (Debian packages e2fsprogs and xfsprogs on the build host).
var mkfsTools = []HostFile{
	{Source: "/sbin/mke2fs", Dest: "usr/sbin/mke2fs", Links: []string{"usr/sbin/mkfs.ext4"}, Executable: true},
	{Source: "/etc/mke2fs.conf", Dest: "etc/mke2fs.conf"},
	{Source: "/sbin/mkfs.xfs", Dest: "usr/sbin/mkfs.xfs", Executable: true},
}
