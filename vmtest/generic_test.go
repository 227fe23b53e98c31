//go:build built

package vmtest

import (
	"context"
	"testing"
	"time"

	"plinth.dev/plinth/board"
	"plinth.dev/plinth/launch"
)

// TestGenericBoard: the generic-x86_64 board's disk.img, flashed onto a
// SATA disk, boots under OVMF on a machine that looks like a PC (AHCI,
// an Intel e1000e NIC, a USB keyboard; no virtio disk or NIC): its early
// modules find the disk, the NIC and the keyboard, the node bootstraps
// (parameters from the ESP, address by DHCP through the e1000e) and is
// ready. /init's lines reach the serial port although /dev/console is
// the screen (the board names tty0 last).
func TestGenericBoard(t *testing.T) {
	parallel(t, 44*time.Second) // single-machine tests run two at a time: see the package doc
	ctx, cancel := context.WithTimeout(context.Background(), 2*bootTimeout)
	defer cancel()
	p := launch.BootstrapParameters()
	p.Tpm.AllowUnmeasuredBoot = false
	m := newMachine(t, p)
	m.img = genericImage(t)
	if m.img.Board == nil || m.img.Board.Name == board.Default {
		t.Fatal("not the generic board")
	}
	flashMachine(t, m, 3<<30)
	n := m.boot(t, ctx, "boot1", diskBoot(m), func(o *launch.NodeOptions) {
		o.PC = &launch.PC{SATA: true, NIC: "e1000e", USBKeyboard: true}
	})
	mustLine(t, ctx, n, `I init: map and mount the system image \(dm-verity\) detail=.*/dev/sda2.*\(slot a\)`)
	mustLine(t, ctx, n, `I init: read node parameters detail="?from esp`)
	mustLine(t, ctx, n, `I init: TPM and measured boot detail=.*firmware measured the UKI`)
	mustLine(t, ctx, n, `I init: storage: mark setup complete`)
	hw := mustLine(t, ctx, n, `I init: hardware disks="sda \(sd, ahci\)" network="eth0 \(e1000e\)" inputs=".*USB Keyboard.*"`)
	t.Log(hw[0])
	mustLine(t, ctx, n, `I init: node ready`)
	powerOff(t, ctx, n)
}
