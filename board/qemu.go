package board

import (
	"slices"
	"strings"

	"plinth.dev/plinth/platform/layout"
)

// qemuBoard is the default board: QEMU's q35 machine with virtio devices
// and Debian's cloud kernel.
var qemuBoard = &Board{
	Name:          "qemu-x86_64",
	KernelPackage: "linux-image-6.1.0-57-cloud-amd64",
	EarlyModules: slices.Concat(
		// disks, network, entropy
		[]string{"virtio_pci", "virtio_blk", "virtio_net", "virtio_rng"},
		systemImageModules, dataDiskModules,
		// node parameters from QEMU, ACPI power button, the watchdog of
		// an update's trial boot (this kernel has no QEMU watchdog driver)
		[]string{"qemu_fw_cfg", "button", "evdev", "softdog"},
		espModules),
	SystemModules: []string{
		"overlay", "xfs",
		"bridge", "br_netfilter", "veth", "vxlan", "nf_tables", "wireguard",
	},
	KubernetesModules: kubernetesModules,
	Arch:              "amd64",
	HostFiles:         append(append(append([]HostFile(nil), mkfsTools...), nftTool), mountTools...),
	Console:           "ttyS0",
	// tsc=reliable: QEMU's vCPUs read one virtual TSC, but under TCG the
	// kernel's boot-time sync check fails and it falls back to the HPET,
	// so every clock read (Go's scheduler and timers make many) leaves
	// the vDSO for a syscall and an emulated MMIO read: an idle
	// three-member cluster kept most of a host core busy. Under KVM the
	// kernel prefers kvm-clock either way.
	//
	// A 10 ms timer slack (layout.TimerSlackArg, init's "timer slack"
	// step): an idle Kubernetes node took 1500 local timer interrupts a
	// second, each an emulated interrupt, a wake-up and often an address
	// space switch, which TCG pays for with a flushed soft TLB; its
	// processes' own CPU was under half of what QEMU used. Timers allowed
	// to fire late share those interrupts: side by side, an idle node's
	// QEMU used a quarter less host CPU with 4 ms than with the kernel's
	// 50 µs, and 8 % less again with 10 ms (README, benchmarks). A real
	// machine's board keeps the kernel's 50 µs: its workloads may pace
	// themselves with short sleeps, and a wake-up there is cheap.
	Cmdline: append([]string{"tsc=reliable", layout.TimerSlackArg + "=10ms"}, commonCmdline...),
	QEMU:    QEMU{Machine: "q35", MemoryMiB: 2048, CPUs: 2},
}

func init() { register(qemuBoard) }

// commonCmdline: panic=-1: a kernel panic reboots at once instead of
// hanging; loglevel=4 puts the kernel's errors and worse (levels below
// 4) on the console: not its warnings, nor the registers and stack of a
// soft lockup report, which are printed at the default level (4).
var commonCmdline = []string{"panic=-1", "loglevel=4"}

// Early modules every board needs (the kernel cannot load modules on
// demand: there is no modprobe).
var (
	// the system image: a file in the initramfs or a slot partition,
	// behind dm-verity
	systemImageModules = []string{"loop", "dm_verity", "squashfs"}
	// the data disk: dm-crypt, dm-integrity and their ciphers
	// the data volume: its encryption, and the quota format of ext4's
	// project quotas (the local volumes' size limits): ext4 refuses to
	// mount a filesystem with the quota feature without it
	dataDiskModules = []string{"dm_crypt", "dm_integrity", "xts", "ecb", "authenc", "aesni_intel", "quota_v2"}
	// a disk boot: the UKI's ESP (systemd-stub's EFI variables name it)
	// and the node parameters on it
	espModules = []string{"efivarfs", "vfat", "nls_cp437", "nls_ascii", "nls_utf8"}
)

// mkfsTools are the filesystem creators the storage service runs
// (Debian packages e2fsprogs and xfsprogs on the build host).
var mkfsTools = []HostFile{
	{Source: "/sbin/mke2fs", Dest: "usr/sbin/mke2fs", Links: []string{"usr/sbin/mkfs.ext4"}, Executable: true},
	{Source: "/etc/mke2fs.conf", Dest: "etc/mke2fs.conf"},
	{Source: "/sbin/mkfs.xfs", Dest: "usr/sbin/mkfs.xfs", Executable: true},
}

// mountTools are mount(8) and umount(8) (Debian package mount): the
// kubelet mounts pods' volumes (tmpfs, projected service account tokens)
// through them.
var mountTools = []HostFile{
	{Source: "/usr/bin/mount", Dest: "usr/bin/mount", Executable: true},
	{Source: "/usr/bin/umount", Dest: "usr/bin/umount", Executable: true},
}

// nftTool is nft (Debian package nftables), which kube-proxy's nftables
// mode and the CNI plugins' nftables masquerading run.
var nftTool = HostFile{Source: "/usr/sbin/nft", Dest: strings.TrimPrefix(layout.NftBinary, "/"), Executable: true}

// kubernetesModules are every module of the Debian cloud kernel 6.1 that
// the Kubernetes worker needs and that is not built in (their
// dependencies, e.g. nf_conntrack, nf_nat, nf_defrag_*, libcrc32c, llc,
// stp, come with them). No x_tables, xt_* or nft_compat: the node has no
// iptables, and kube-proxy runs in nftables mode.
var kubernetesModules = []string{
	// containerd's overlayfs snapshotter
	"overlay",
	// pod network: ptp's veth pairs; bridge and br_netfilter so that
	// bridged pod traffic passes the nftables rules too
	"veth", "bridge", "br_netfilter",
	// the link-local address the node's DNS server answers on
	"dummy",
	// nftables and what kube-proxy's nftables mode and the CNI plugins'
	// masquerading use: conntrack state and its netlink interface
	// (kube-proxy clears stale UDP flows), NAT chains, DNAT/masquerade,
	// random endpoint choice (numgen), fib "is this address local",
	// reject for Services without endpoints, rate limits
	"nf_tables", "nfnetlink", "nf_conntrack", "nf_conntrack_netlink", "nf_nat",
	"nft_ct", "nft_nat", "nft_chain_nat", "nft_masq", "nft_redir", "nft_numgen",
	"nft_fib_inet", "nft_fib_ipv4", "nft_fib_ipv6", "nft_limit",
	"nft_reject_inet", "nft_reject_ipv4", "nft_reject_ipv6", "nf_reject_ipv4", "nf_reject_ipv6",
}
