package main

import (
	"context"
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"time"

	"plinth.dev/plinth/board"
	"plinth.dev/plinth/vmtest"
)

func init() {
	commands["run"] = command{"boot one node of a built image in QEMU with its own swtpm", runNode}
}

// runNode boots one node and streams its console. The first Ctrl-C asks
// the node to power off (ACPI power button), a second one kills QEMU.
func runNode(ctx context.Context, args []string) error {
	fs := flag.NewFlagSet("run", flag.ExitOnError)
	imageDir := fs.String("image", "out/image/"+board.Default, "image directory (plinthctl build -out)")
	state := fs.String("state", "out/run/"+board.Default, "directory for the node's disk, TPM state and logs (kept between runs)")
	diskSize := fs.Int64("disk-size", 4<<30, "size of the data disk file created on first run")
	paramsFile := fs.String("params", "", "node parameters (plinthctl params); default: STATE/parameters.pb, created on first run for a bootstrap node with a TPM")
	fs.Parse(args)
	img, err := vmtest.LoadImage(*imageDir)
	if err != nil {
		return err
	}
	if err := os.MkdirAll(filepath.Join(*state, "tpm"), 0o755); err != nil {
		return err
	}
	if *paramsFile == "" {
		*paramsFile = filepath.Join(*state, "parameters.pb")
		if _, err := os.Stat(*paramsFile); os.IsNotExist(err) {
			fmt.Fprintf(os.Stderr, "plinthctl: first run: writing bootstrap parameters to %s\n", *paramsFile)
			if _, err := vmtest.WriteParameters(*paramsFile, vmtest.BootstrapParameters()); err != nil {
				return err
			}
		}
	}
	o := img.NodeOptions("node").WithParameters(*paramsFile)
	o.WorkDir = *state
	o.DiskPath, o.DiskSizeBytes = filepath.Join(*state, "disk.img"), *diskSize
	o.TPMStateDir = filepath.Join(*state, "tpm")
	o.Console = os.Stdout

	// The node must outlive the first Ctrl-C, which only asks it to stop.
	n, err := vmtest.Launch(context.WithoutCancel(ctx), o)
	if err != nil {
		return err
	}
	defer n.Close()
	fmt.Fprintf(os.Stderr, "plinthctl: booting %s (kernel %s, %s acceleration); console log in %s; Ctrl-C powers the node off\n",
		img.Manifest.Board, img.Manifest.KernelVersion, accel(), n.ConsolePath())
	select {
	case <-n.Exited():
	case <-ctx.Done():
		fmt.Fprintln(os.Stderr, "\nplinthctl: sending ACPI power-off to the node (Ctrl-C again to kill it)")
		pctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		err := n.PowerDown(pctx)
		cancel()
		if err != nil {
			fmt.Fprintf(os.Stderr, "plinthctl: power-off request failed: %v\n", err)
		}
		again, stop := signalContext()
		defer stop()
		select {
		case <-n.Exited():
		case <-again.Done():
			n.Kill()
		case <-time.After(2 * time.Minute):
			n.Kill()
		}
	}
	return n.Wait(context.Background())
}

func accel() string {
	if vmtest.KVMAvailable() {
		return "KVM"
	}
	return "TCG (no KVM)"
}
