package main

import (
	"log/slog"
	"os"
	"path/filepath"
	"strings"

	"plinth.dev/plinth/platform/kmod"
)

// reportHardware says what the kernel and the board's early modules found:
// the TPM, disks and network interfaces with the drivers bound to them,
// input devices (a keyboard on the console). On a new machine this line
// tells whether the board covers it.
func reportHardware(l *slog.Logger) {
	var tpms []string
	for _, d := range []string{"/dev/tpmrm0", "/dev/tpm0"} {
		if _, err := os.Stat(d); err == nil {
			tpms = append(tpms, d)
		}
	}
	if len(tpms) == 0 {
		l.Warn("no TPM device found")
	} else {
		l.Info("TPM device present", "devices", strings.Join(tpms, ","))
	}
	virtual := func(prefixes ...string) func(string) bool {
		return func(name string) bool {
			for _, p := range prefixes {
				if strings.HasPrefix(name, p) {
					return false
				}
			}
			return true
		}
	}
	l.Info("hardware",
		"disks", joinBound(kmod.BoundDevices("/sys", "block", virtual("loop", "ram", "dm-", "zram"))),
		"network", joinBound(kmod.BoundDevices("/sys", "class/net", virtual("lo"))),
		"inputs", strings.Join(inputNames("/sys/class/input"), "; "))
}

func joinBound(b []kmod.Bound) string {
	s := make([]string, len(b))
	for i, x := range b {
		s[i] = x.String()
	}
	return strings.Join(s, "; ")
}

// inputNames are the names of the input devices (input0, input1…).
func inputNames(dir string) []string {
	m, _ := filepath.Glob(filepath.Join(dir, "input*", "name"))
	var out []string
	for _, f := range m {
		if b, err := os.ReadFile(f); err == nil {
			out = append(out, strings.TrimSpace(string(b)))
		}
	}
	return out
}
