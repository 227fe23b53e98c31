// Command bareinit is the whole userspace of the "bare boot" benchmark: it
// proves the kernel reached /init, reports how long that took, and powers
// off so that QEMU exits and the benchmark can time the full round trip.
//
// It must be built static (CGO_ENABLED=0): the initramfs has no libc.
package main

import (
	"fmt"
	"os"
	"strings"
	"time"

	"golang.org/x/sys/unix"
)

func main() {
	uptime := "unknown"
	if err := os.MkdirAll("/proc", 0o755); err == nil {
		if err := unix.Mount("proc", "/proc", "proc", 0, ""); err == nil || err == unix.EBUSY {
			if b, err := os.ReadFile("/proc/uptime"); err == nil {
				if f := strings.Fields(string(b)); len(f) > 0 {
					uptime = f[0]
				}
			}
		}
	}
	console := openConsole()
	fmt.Fprintf(console, "bareinit: reached userspace uptime=%s\n", uptime)
	console.Sync()
	unix.Sync()
	if err := unix.Reboot(unix.LINUX_REBOOT_CMD_POWER_OFF); err != nil {
		fmt.Fprintf(console, "bareinit: power off: %v\n", err)
	}
	// PID 1 must never return: the kernel would panic and the benchmark
	// would read a panic as a successful (exit 0, -no-reboot) run.
	for {
		time.Sleep(time.Hour)
	}
}

// openConsole finds a writable console. The bare initramfs has no
// /dev/console node, so the kernel started us without stdio; devtmpfs
// provides the node.
func openConsole() *os.File {
	if f, err := os.OpenFile("/dev/console", os.O_WRONLY, 0); err == nil {
		return f
	}
	os.MkdirAll("/dev", 0o755)
	unix.Mount("devtmpfs", "/dev", "devtmpfs", 0, "")
	if f, err := os.OpenFile("/dev/console", os.O_WRONLY, 0); err == nil {
		return f
	}
	return os.Stdout
}
