// Package watchdog arms the kernel's watchdog device (/dev/watchdog: a
// hardware watchdog, or softdog) and keeps it from resetting the machine
// while the caller says the system makes progress.
//
//	Open ─► /dev/watchdog armed, timeout set ─► Pet every interval ─► Disarm ('V', close)
//	                                              └─ no Pet for timeout (the process hangs,
//	                                                 the kernel stalls): the machine resets
//
// A trial boot of an A/B update arms it (init/update.go): a new image that
// hangs — not only one that fails — then returns to the old slot by itself.
// softdog, a kernel timer, covers a hung userspace (the usual hang of a
// new image); a hardware watchdog also a hung kernel.
package watchdog

import (
	"errors"
	"fmt"
	"os"
	"strings"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"
)

// Device is the first watchdog the kernel registered.
const Device = "/dev/watchdog"

// Watchdog is an armed watchdog device.
type Watchdog struct {
	f        *os.File
	Identity string        // the driver's name for it, e.g. "Software Watchdog"
	Timeout  time.Duration // as the driver set it
}

// ErrNone: the machine has no watchdog device (no driver loaded one).
var ErrNone = errors.New("watchdog: no watchdog device")

// Open arms the watchdog with timeout (the driver may round it).
func Open(timeout time.Duration) (*Watchdog, error) {
	f, err := os.OpenFile(Device, os.O_WRONLY, 0)
	if errors.Is(err, os.ErrNotExist) {
		return nil, ErrNone
	}
	if err != nil {
		return nil, fmt.Errorf("watchdog: %w", err)
	}
	w := &Watchdog{f: f}
	secs := int32(timeout / time.Second)
	if err := ioctl(f, unix.WDIOC_SETTIMEOUT, unsafe.Pointer(&secs)); err != nil {
		w.Disarm()
		return nil, fmt.Errorf("watchdog: setting the timeout: %w", err)
	}
	w.Timeout = time.Duration(secs) * time.Second
	if b, err := os.ReadFile("/sys/class/watchdog/watchdog0/identity"); err == nil {
		w.Identity = strings.TrimSpace(string(b))
	}
	return w, nil
}

// Pet restarts the countdown.
func (w *Watchdog) Pet() error {
	var dummy int32
	return ioctl(w.f, unix.WDIOC_KEEPALIVE, unsafe.Pointer(&dummy))
}

// Disarm stops the watchdog: the magic close ('V' before close), which
// drivers built without nowayout honour.
func (w *Watchdog) Disarm() error {
	_, werr := w.f.Write([]byte("V"))
	cerr := w.f.Close()
	return errors.Join(werr, cerr)
}

func ioctl(f *os.File, req uint, arg unsafe.Pointer) error {
	if _, _, e := unix.Syscall(unix.SYS_IOCTL, f.Fd(), uintptr(req), uintptr(arg)); e != 0 {
		return e
	}
	return nil
}
