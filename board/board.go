// Package board defines the hardware targets Plinth builds images for: which
// Debian kernel package, which kernel modules (early ones in the initramfs,
// the rest in the system image, and those Kubernetes loads), the kernel
// command line and how QEMU runs the board.
package board

import (
	"fmt"
	"sort"
)

// Board is one hardware target.
type Board struct {
	Name string
	// KernelPackage is the Debian package carrying the kernel and its
	// modules, pinned to one ABI so a build is reproducible.
	KernelPackage string
	// EarlyModules are loaded by /init from the initramfs, in the order
	// the builder computes from their dependencies: what is needed to find
	// and verify the system image, talk to disks, network and power.
	EarlyModules []string
	// SystemModules are carried in the system image for later use.
	SystemModules []string
	// KubernetesModules are what the Kubernetes worker loads when it
	// starts, never at boot: the container runtime's overlayfs, the pod
	// network (veth, bridge), kube-proxy's nftables rules and the dummy
	// link of the node's DNS address. The builder carries their closure in
	// the system image and writes its load order (minus what boot loads
	// anyway) to layout.KubernetesModuleLoadList.
	KubernetesModules []string
	// Arch is the GOARCH of the node's programs and container images; the
	// builder refuses binaries built for another machine.
	Arch string
	// HostFiles are copied from the build host into the system image:
	// the real mkfs programs and nft (with their shared libraries) and
	// their configuration.
	HostFiles []HostFile
	// Console is the serial console device.
	Console string
	// Cmdline holds the kernel arguments apart from console and the
	// system image parameters, which the builder adds.
	Cmdline []string
	// QEMU says how vmtest and `make run` start this board.
	QEMU QEMU
}

// HostFile is one file taken from the build host.
type HostFile struct {
	// Source is the path on the build host (symlinks are followed).
	Source string
	// Dest is the path in the system image, without a leading slash.
	Dest string
	// Links are extra names in the image, symlinked to Dest.
	Links []string
	// Executable files get their shared libraries and ELF interpreter
	// copied too.
	Executable bool
}

// QEMU settings for a board.
type QEMU struct {
	Machine   string
	MemoryMiB int
	CPUs      int
}

// KernelCmdline is the whole command line minus the system image
// parameters.
func (b *Board) KernelCmdline() []string {
	return append([]string{"console=" + b.Console}, b.Cmdline...)
}

var boards = map[string]*Board{}

func register(b *Board) { boards[b.Name] = b }

// Get returns a board by name.
func Get(name string) (*Board, error) {
	b, ok := boards[name]
	if !ok {
		return nil, fmt.Errorf("unknown board %q (known: %v)", name, Names())
	}
	return b, nil
}

// Names lists the known boards.
func Names() []string {
	var n []string
	for k := range boards {
		n = append(n, k)
	}
	sort.Strings(n)
	return n
}

// Default is the board `make image` and `make run` use.
const Default = "qemu-x86_64"
