package mount

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
)

// DevLinks are the links the kernel's device list calls compulsory in
// /dev (Documentation/admin-guide/devices.rst, "Compulsory links"):
// devtmpfs does not make them, udev or systemd-tmpfiles do elsewhere, and
// programs open them by name. crun reads the resources of `update
// --resources -` (containerd's in-place pod resize) from /dev/stdin and
// fails without it; shells' `<(…)` and `/dev/fd/N` arguments use /dev/fd.
var DevLinks = []struct{ Name, Target string }{
	{"fd", "/proc/self/fd"},
	{"stdin", "fd/0"},
	{"stdout", "fd/1"},
	{"stderr", "fd/2"},
}

// MakeDevLinks makes DevLinks in dev (/dev). An entry that already
// exists is left as it is (a link made by an earlier boot step, or a
// device node), so the step can run again.
func MakeDevLinks(dev string) error {
	for _, l := range DevLinks {
		p := filepath.Join(dev, l.Name)
		if err := os.Symlink(l.Target, p); err != nil && !errors.Is(err, os.ErrExist) {
			return fmt.Errorf("link %s to %s: %w", p, l.Target, err)
		}
	}
	return nil
}
