// Package power watches the ACPI power button, so a hypervisor's or a
// person's "power off" turns into a clean shutdown of the node.
//
//	ACPI (LNXPWRBN) ──► button module ──► input device "Power Button"
//	    ──► evdev /dev/input/eventN ──► KEY_POWER pressed ──► callback
package power

import (
	"context"
	"encoding/binary"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"time"

	"plinth.dev/plinth/platform/supervisor"
)

const (
	evKey      = 0x01
	keyPower   = 116
	eventSize  = 24 // struct input_event on 64-bit: timeval, type, code, value
	deviceName = "Power Button"
)

// FindButtons returns the event device nodes of every power button.
func FindButtons() ([]string, error) {
	names, err := filepath.Glob("/sys/class/input/event*/device/name")
	if err != nil {
		return nil, err
	}
	var devs []string
	for _, n := range names {
		b, err := os.ReadFile(n)
		if err != nil || strings.TrimSpace(string(b)) != deviceName {
			continue
		}
		ev := filepath.Base(filepath.Dir(filepath.Dir(n)))
		devs = append(devs, "/dev/input/"+ev)
	}
	return devs, nil
}

// WatchButton returns a runnable that calls onPress whenever a power button
// is pressed. It is healthy once it listens on at least one button.
func WatchButton(onPress func()) supervisor.Runnable {
	return func(ctx context.Context) error {
		log := supervisor.Logger(ctx)
		var devs []string
		// The button driver may register its input device a moment after
		// its module loaded.
		for attempt := 0; ; attempt++ {
			var err error
			if devs, err = FindButtons(); err != nil {
				return err
			}
			if len(devs) > 0 {
				break
			}
			if attempt == 20 {
				return fmt.Errorf("no %q input device (are the button and evdev modules loaded?)", deviceName)
			}
			select {
			case <-time.After(100 * time.Millisecond):
			case <-ctx.Done():
				return ctx.Err()
			}
		}
		pressed := make(chan string, 1)
		errs := make(chan error, len(devs))
		for _, d := range devs {
			f, err := os.Open(d)
			if err != nil {
				return err
			}
			defer f.Close()
			go func() { errs <- readEvents(f, d, pressed) }()
		}
		log.Info("listening for the power button", "devices", strings.Join(devs, ","))
		supervisor.Signal(ctx, supervisor.SignalHealthy)
		for {
			select {
			case d := <-pressed:
				log.Info("power button pressed", "device", d)
				onPress()
			case err := <-errs:
				return err
			case <-ctx.Done():
				return ctx.Err()
			}
		}
	}
}

func readEvents(f *os.File, dev string, pressed chan<- string) error {
	buf := make([]byte, eventSize*16)
	for {
		n, err := f.Read(buf)
		if err != nil {
			return fmt.Errorf("reading %s: %w", dev, err)
		}
		for off := 0; off+eventSize <= n; off += eventSize {
			ev := buf[off : off+eventSize]
			typ := binary.LittleEndian.Uint16(ev[16:])
			code := binary.LittleEndian.Uint16(ev[18:])
			value := int32(binary.LittleEndian.Uint32(ev[20:]))
			if typ == evKey && code == keyPower && value == 1 {
				select {
				case pressed <- dev:
				default:
				}
			}
		}
	}
}
