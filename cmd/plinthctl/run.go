package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"time"

	"plinth.dev/plinth/board"
	"plinth.dev/plinth/platform/layout"
	"plinth.dev/plinth/roleserver/owner"
	"plinth.dev/plinth/vmtest"
)

func init() {
	commands["run"] = command{"boot one node of a built image in QEMU with its own swtpm", runNode}
}

// runNode boots one node and streams its console. The first Ctrl-C asks
// the node to power off (ACPI power button), a second one kills QEMU.
//
// The node is on QEMU user networking (10.0.2.15); its curator and
// NodeManagement ports are forwarded from 127.0.0.1. On the first run the
// bootstrap parameters get a fresh owner key, saved as the owner
// configuration directory (-owner-dir) that plinthctl takeownership and
// the cluster commands use.
func runNode(ctx context.Context, args []string) error {
	fs := flag.NewFlagSet("run", flag.ExitOnError)
	imageDir := fs.String("image", "out/image/"+board.Default, "image directory (plinthctl build -out)")
	state := fs.String("state", "out/run/"+board.Default, "directory for the node's disk, TPM state and logs (kept between runs)")
	diskSize := fs.Int64("disk-size", 4<<30, "size of the data disk file created on first run")
	paramsFile := fs.String("params", "", "node parameters (plinthctl params); default: STATE/parameters.pb, created on first run for a bootstrap node with a TPM")
	ownerDir := fs.String("owner-dir", "", "owner configuration `dir` the first run writes the owner key to (default STATE/owner)")
	curatorPort := fs.Int("curator-port", layout.CuratorPort, "host `port` on 127.0.0.1 forwarded to the node's curator (0: none)")
	mgmtPort := fs.Int("mgmt-port", layout.NodeManagementPort, "host `port` on 127.0.0.1 forwarded to the node's NodeManagement (0: none)")
	fs.Parse(args)
	if *ownerDir == "" {
		*ownerDir = filepath.Join(*state, "owner")
	}
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
			if err := firstRunParameters(*paramsFile, *ownerDir); err != nil {
				return err
			}
		}
	}
	o := img.NodeOptions("node").WithParameters(*paramsFile)
	o.WorkDir = *state
	o.DiskPath, o.DiskSizeBytes = filepath.Join(*state, "disk.img"), *diskSize
	o.TPMStateDir = filepath.Join(*state, "tpm")
	o.Console = os.Stdout
	for _, f := range []vmtest.Forward{{HostPort: *curatorPort, GuestPort: layout.CuratorPort}, {HostPort: *mgmtPort, GuestPort: layout.NodeManagementPort}} {
		if f.HostPort != 0 {
			o.HostForwards = append(o.HostForwards, f)
		}
	}

	fmt.Fprintf(os.Stderr, "plinthctl: booting %s (kernel %s, %s acceleration); console log in %s; Ctrl-C powers the node off\n",
		img.Manifest.Board, img.Manifest.KernelVersion, accel(), filepath.Join(*state, "console.log"))
	printNextSteps(*ownerDir, *curatorPort, *mgmtPort)
	for {
		rebooted, err := bootOnce(ctx, o)
		if err != nil || !rebooted || ctx.Err() != nil {
			return err
		}
		// QEMU runs with -no-reboot: a reboot ends it, and the next boot
		// is a new QEMU with the same disk and TPM.
		fmt.Fprintln(os.Stderr, "plinthctl: the node rebooted; starting it again")
	}
}

// rebootLine is what init prints last before a reboot (vmtest's too).
var rebootLine = regexp.MustCompile(`handing over to PID 1 .*action=reboot`)

// bootOnce runs one boot of the node until QEMU exits, and reports
// whether the guest rebooted.
func bootOnce(ctx context.Context, o vmtest.NodeOptions) (bool, error) {
	// The node must outlive the first Ctrl-C, which only asks it to stop.
	n, err := vmtest.Launch(context.WithoutCancel(ctx), o)
	if err != nil {
		return false, err
	}
	defer n.Close()
	select {
	case <-n.Exited():
		if err := n.Wait(context.Background()); err != nil {
			return false, err
		}
		return slices.ContainsFunc(n.Lines(), rebootLine.MatchString), nil
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
	return false, n.Wait(context.Background())
}

func accel() string {
	if vmtest.KVMAvailable() {
		return "KVM"
	}
	return "TCG (no KVM)"
}

// firstRunParameters writes bootstrap parameters with a fresh owner key
// and saves the key in ownerDir, refusing to replace an existing key.
func firstRunParameters(paramsFile, ownerDir string) error {
	if _, err := os.Stat(filepath.Join(ownerDir, owner.KeyFile)); err == nil {
		return fmt.Errorf("%s already holds an owner key (of an earlier node?): move it away or pass -owner-dir", ownerDir)
	}
	p, key := vmtest.BootstrapParametersWithOwner()
	if err := (&owner.Config{Dir: ownerDir, Key: key}).Save(); err != nil {
		return err
	}
	fmt.Fprintf(os.Stderr, "plinthctl: first run: writing bootstrap parameters to %s, owner key to %s\n",
		paramsFile, filepath.Join(ownerDir, owner.KeyFile))
	if _, err := vmtest.WriteParameters(paramsFile, p); err != nil {
		os.Remove(filepath.Join(ownerDir, owner.KeyFile))
		return err
	}
	return nil
}

// printNextSteps tells how to take ownership of the node, or how to reach
// it once that is done.
func printNextSteps(ownerDir string, curatorPort, mgmtPort int) {
	self := "plinthctl"
	if strings.Contains(os.Args[0], "go-build") {
		self = "go run ./cmd/plinthctl"
	} else if strings.Contains(os.Args[0], "/") {
		self = os.Args[0]
	}
	cfg, err := owner.LoadConfig(ownerDir)
	switch {
	case errors.Is(err, os.ErrNotExist) || (err == nil && cfg.Key == nil):
		fmt.Fprintf(os.Stderr, "plinthctl: no owner key in %s (the node's parameters were not made by a first plinthctl run): take ownership with their key (takeownership -owner-key FILE), or start afresh with an empty -state\n", ownerDir)
		return
	case err != nil:
		fmt.Fprintf(os.Stderr, "plinthctl: %v\n", err)
		return
	case curatorPort == 0:
		return
	}
	config := " -config " + ownerDir
	if cfg.Credentials == nil {
		mgmt := ""
		if mgmtPort != 0 {
			mgmt = " -mgmt-endpoint " + net.JoinHostPort("127.0.0.1", strconv.Itoa(mgmtPort))
		}
		fmt.Fprintf(os.Stderr, "plinthctl: once the console shows \"cluster bootstrapped\", in another shell:\n  %s takeownership%s -endpoint %s%s\n",
			self, config, net.JoinHostPort("127.0.0.1", strconv.Itoa(curatorPort)), mgmt)
	} else {
		fmt.Fprintf(os.Stderr, "plinthctl: you own this node (%s); in another shell:\n", ownerDir)
	}
	fmt.Fprintf(os.Stderr, "  %s nodes list%s\n  %s logs%s NODE\n", self, config, self, config)
}
