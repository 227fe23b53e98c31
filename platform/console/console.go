// Package console finds the kernel's consoles besides /dev/console, so
// that a node's log lines reach every console the command line names.
//
//	console=ttyS0,115200 console=tty0
//	        │                    └── /dev/console (the last one): PID 1's stdout
//	        └── another console: the kernel writes its messages there too,
//	            but a process only through /dev/ttyS0 itself
//
// Why: a machine on a desk shows its screen (tty0), one in a rack its
// serial port; the kernel prints to both, and without this /init's own
// lines (which say why a node halted) would reach only one.
package console

import (
	"os"
	"path/filepath"
	"strings"
)

// ActiveFile lists the kernel's consoles, /dev/console's last.
const ActiveFile = "/sys/class/tty/console/active"

// Others returns the device paths of the consoles in ActiveFile's
// content active other than /dev/console's (the last entry), in order.
func Others(active string) []string {
	f := strings.Fields(active)
	if len(f) < 2 {
		return nil
	}
	var out []string
	seen := map[string]bool{f[len(f)-1]: true}
	for _, name := range f[:len(f)-1] {
		if seen[name] || strings.ContainsAny(name, "/.") {
			continue
		}
		seen[name] = true
		out = append(out, filepath.Join("/dev", name))
	}
	return out
}

// OpenOthers opens the other consoles for writing (those that cannot be
// opened are left out: a log line must not fail on them).
func OpenOthers() []*os.File {
	b, err := os.ReadFile(ActiveFile)
	if err != nil {
		return nil
	}
	var out []*os.File
	for _, p := range Others(string(b)) {
		if f, err := os.OpenFile(p, os.O_WRONLY|os.O_APPEND|noCTTY, 0); err == nil {
			out = append(out, f)
		}
	}
	return out
}
