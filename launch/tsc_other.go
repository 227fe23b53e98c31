//go:build !amd64

package launch

// hostTSCkHz: only an amd64 host's TSC is the TCG guest's (QEMU reads
// the host's counter for the guest's RDTSC); elsewhere the guest
// calibrates its own.
func hostTSCkHz() uint64 { return 0 }
