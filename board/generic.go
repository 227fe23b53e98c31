package board

import "slices"

// generic-x86_64: real x86-64 machines. Debian's generic kernel (the cloud
// kernel has no SATA, no USB and few NIC drivers) with, as modules loaded
// at boot, what a node needs to find its disks, reach the network and
// take a USB keyboard on its screen console:
//
//	disks      NVMe, SATA (AHCI), USB mass storage, virtio (VMs)
//	network    Intel e1000/e1000e/igb/igc/ixgbe/i40e, Realtek r8169,
//	           Broadcom tg3/bnxt, Mellanox ConnectX (mlx5), virtio
//	console    screen (tty0, /dev/console: /init's lines go there) and
//	           the first serial port (kernel and /init lines too);
//	           USB keyboards (xHCI/EHCI/OHCI/UHCI + HID), PS/2 is built in
//
// The TPM drivers (TIS, CRB) and the framebuffer console are built
// into this kernel. NIC firmware is not carried: the drivers above run
// the common parts without it.
func init() {
	register(&Board{
		Name:          "generic-x86_64",
		KernelPackage: "linux-image-6.1.0-57-amd64",
		EarlyModules: slices.Concat(
			[]string{
				// disks
				"nvme", "ahci", "sd_mod", "usb_storage", "uas", "virtio_pci", "virtio_blk", "virtio_scsi",
				// network
				"e1000", "e1000e", "igb", "igc", "ixgbe", "i40e", "r8169", "tg3", "bnxt_en", "mlx5_core", "virtio_net",
				// USB keyboards
				"xhci_pci", "ehci_pci", "ohci_pci", "uhci_hcd", "usbhid", "hid_generic",
				// entropy in VMs, node parameters from QEMU (harmless
				// elsewhere), ACPI power button
				"virtio_rng", "qemu_fw_cfg", "button", "evdev",
				// the data volume (built into the cloud kernel)
				"ext4", "crc32c_intel", "crc32c_generic",
				// the watchdog of an update's trial boot: Intel's (through
				// the LPC bridge), AMD's, QEMU's; softdog last, so a
				// hardware one is /dev/watchdog when there is one
				"lpc_ich", "iTCO_wdt", "sp5100_tco", "i6300esb", "softdog",
			},
			systemImageModules, dataDiskModules, espModules),
		SystemModules:     qemuBoard.SystemModules,
		KubernetesModules: kubernetesModules,
		Arch:              "amd64",
		HostFiles:         qemuBoard.HostFiles,
		// The serial port first, the screen last: the last console= is
		// /dev/console, and /init writes its lines to the others too.
		Console: "ttyS0,115200",
		// Not the QEMU board's tsc=reliable: a real machine's TSC is
		// trusted only when the kernel finds it so.
		Cmdline: append([]string{"console=tty0"}, commonCmdline...),
		// How vmtest boots it: like a PC (see vmtest's generic board test).
		QEMU: qemuBoard.QEMU,
	})
}
