// Command init is /init of a Plinth node.
//
// The kernel starts it as PID 1; it then runs twice:
//
//	PID 1  (reaper.Run)   mounts /proc /sys /dev, starts itself again as the core,
//	                      reaps orphans, forwards signals, powers off / reboots.
//	core   (bootCore)     everything else: the boot steps (boot.go, type boot:
//	                      each step's inputs and outputs are its fields),
//	                      then the supervised node (node.go).
package main

import (
	"fmt"
	"log/slog"
	"os"
	"time"

	"plinth.dev/plinth/platform/logtree"
	"plinth.dev/plinth/platform/reaper"
)

// version is set by the build (-ldflags -X main.version=...).
var version = "dev"

const roleEnv = "PLINTH_INIT_ROLE"

func main() {
	switch {
	case os.Getpid() == 1:
		line := func(msg string) string {
			return logtree.Entry{Time: time.Now(), Level: slog.LevelInfo, DN: "pid1", Message: msg}.String()
		}
		reaper.Run(os.Stdout, line, "/init", []string{"/init"}, append(os.Environ(), roleEnv+"=core"))
	case os.Getenv(roleEnv) == "core":
		// Programs the node runs (mkfs, the Kubernetes components) find
		// their helpers (nft, mount) in the system image.
		os.Setenv("PATH", "/usr/sbin:/usr/bin")
		os.Exit(bootCore())
	default:
		fmt.Fprintln(os.Stderr, "this is the Plinth node init; it only runs as PID 1 of a Plinth node")
		os.Exit(2)
	}
}
