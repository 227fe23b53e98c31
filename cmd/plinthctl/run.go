package main

import (
	"context"
	"errors"
	"fmt"
	"io"
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
	register("run", "boot one node of a built image in QEMU with its own swtpm", func() verb { return new(runCmd) })
}

// runCmd is `plinthctl run`: it boots one node and streams its console.
// The first Ctrl-C asks the node to power off (ACPI power button), a
// second one kills QEMU.
//
// The node is on QEMU user networking (10.0.2.15); its curator and
// NodeManagement ports are forwarded from 127.0.0.1. On the first run the
// bootstrap parameters get a fresh owner key, saved as the owner
// configuration directory (-owner-dir) that plinthctl takeownership and
// the cluster commands use.
type runCmd struct {
	image       string
	state       string
	diskSize    int64
	params      string
	ownerDir    string
	curatorPort int
	mgmtPort    int
	apiPort     int
}

func (c *runCmd) run(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs := newFlagSet("run", stderr)
	fs.StringVar(&c.image, "image", "out/image/"+board.Default, "image directory (plinthctl build -out)")
	fs.StringVar(&c.state, "state", "out/run/"+board.Default, "directory for the node's disk, TPM state and logs (kept between runs)")
	fs.Int64Var(&c.diskSize, "disk-size", 4<<30, "size of the data disk file created on first run")
	fs.StringVar(&c.params, "params", "", "node parameters (plinthctl params); default: STATE/parameters.pb, created on first run for a bootstrap node with a TPM")
	fs.StringVar(&c.ownerDir, "owner-dir", "", "owner configuration `dir` the first run writes the owner key to (default STATE/owner)")
	fs.IntVar(&c.curatorPort, "curator-port", layout.CuratorPort, "host `port` on 127.0.0.1 forwarded to the node's curator (0: none)")
	fs.IntVar(&c.mgmtPort, "mgmt-port", layout.NodeManagementPort, "host `port` on 127.0.0.1 forwarded to the node's NodeManagement (0: none)")
	fs.IntVar(&c.apiPort, "kubernetes-port", layout.KubernetesAPIPort, "host `port` on 127.0.0.1 forwarded to the node's Kubernetes API server (0: none)")
	fs.Parse(args)
	if c.ownerDir == "" {
		c.ownerDir = filepath.Join(c.state, "owner")
	}
	img, err := vmtest.LoadImage(c.image)
	if err != nil {
		return err
	}
	if err := os.MkdirAll(filepath.Join(c.state, "tpm"), 0o755); err != nil {
		return err
	}
	if c.params == "" {
		c.params = filepath.Join(c.state, "parameters.pb")
		if _, err := os.Stat(c.params); os.IsNotExist(err) {
			if err := firstRunParameters(stderr, c.params, c.ownerDir); err != nil {
				return err
			}
		}
	}
	o := img.NodeOptions("node").WithParameters(c.params)
	o.WorkDir = c.state
	o.DiskPath, o.DiskSizeBytes = filepath.Join(c.state, "disk.img"), c.diskSize
	o.TPMStateDir = filepath.Join(c.state, "tpm")
	o.Console = stdout
	for _, f := range []vmtest.Forward{{HostPort: c.curatorPort, GuestPort: layout.CuratorPort}, {HostPort: c.mgmtPort, GuestPort: layout.NodeManagementPort},
		{HostPort: c.apiPort, GuestPort: layout.KubernetesAPIPort}} {
		if f.HostPort != 0 {
			o.HostForwards = append(o.HostForwards, f)
		}
	}

	fmt.Fprintf(stderr, "plinthctl: booting %s (kernel %s, %s acceleration); console log in %s; Ctrl-C powers the node off\n",
		img.Manifest.Board, img.Manifest.KernelVersion, accel(), filepath.Join(c.state, "console.log"))
	printNextSteps(stderr, c.ownerDir, c.curatorPort, c.mgmtPort, c.apiPort)
	for {
		rebooted, err := bootOnce(ctx, stderr, o)
		if err != nil || !rebooted || ctx.Err() != nil {
			return err
		}
		// QEMU runs with -no-reboot: a reboot ends it, and the next boot
		// is a new QEMU with the same disk and TPM.
		fmt.Fprintln(stderr, "plinthctl: the node rebooted; starting it again")
	}
}

// rebootLine is what init prints last before a reboot (vmtest's too).
var rebootLine = regexp.MustCompile(`handing over to PID 1 .*action=reboot`)

// bootOnce runs one boot of the node until QEMU exits, and reports
// whether the guest rebooted.
func bootOnce(ctx context.Context, stderr io.Writer, o vmtest.NodeOptions) (bool, error) {
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
		fmt.Fprintln(stderr, "\nplinthctl: sending ACPI power-off to the node (Ctrl-C again to kill it)")
		pctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		err := n.PowerDown(pctx)
		cancel()
		if err != nil {
			fmt.Fprintf(stderr, "plinthctl: power-off request failed: %v\n", err)
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

// firstRunParameters writes bootstrap parameters with a fresh owner key
// and saves the key in ownerDir, refusing to replace an existing key.
func firstRunParameters(stderr io.Writer, paramsFile, ownerDir string) error {
	if _, err := os.Stat(filepath.Join(ownerDir, owner.KeyFile)); err == nil {
		return fmt.Errorf("%s already holds an owner key (of an earlier node?): move it away or pass -owner-dir", ownerDir)
	}
	p, key := vmtest.BootstrapParametersWithOwner()
	if err := (&owner.Config{Dir: ownerDir, Key: key}).Save(); err != nil {
		return err
	}
	fmt.Fprintf(stderr, "plinthctl: first run: writing bootstrap parameters to %s, owner key to %s\n",
		paramsFile, filepath.Join(ownerDir, owner.KeyFile))
	if _, err := vmtest.WriteParameters(paramsFile, p); err != nil {
		os.Remove(filepath.Join(ownerDir, owner.KeyFile))
		return err
	}
	return nil
}

// printNextSteps tells how to take ownership of the node, or how to reach
// it once that is done.
func printNextSteps(stderr io.Writer, ownerDir string, curatorPort, mgmtPort, apiPort int) {
	self := "plinthctl"
	if strings.Contains(os.Args[0], "go-build") {
		self = "go run ./cmd/plinthctl"
	} else if strings.Contains(os.Args[0], "/") {
		self = os.Args[0]
	}
	cfg, err := owner.LoadConfig(ownerDir)
	switch {
	case errors.Is(err, os.ErrNotExist) || (err == nil && cfg.Key == nil):
		fmt.Fprintf(stderr, "plinthctl: no owner key in %s (the node's parameters were not made by a first plinthctl run): take ownership with their key (takeownership -owner-key FILE), or start afresh with an empty -state\n", ownerDir)
		return
	case err != nil:
		fmt.Fprintf(stderr, "plinthctl: %v\n", err)
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
		fmt.Fprintf(stderr, "plinthctl: once the console shows \"cluster bootstrapped\", in another shell:\n  %s takeownership%s -endpoint %s%s\n",
			self, config, net.JoinHostPort("127.0.0.1", strconv.Itoa(curatorPort)), mgmt)
	} else {
		fmt.Fprintf(stderr, "plinthctl: you own this node (%s); in another shell:\n", ownerDir)
	}
	fmt.Fprintf(stderr, "  %s nodes list%s\n  %s logs%s NODE\n", self, config, self, config)
	if apiPort != 0 {
		fmt.Fprintf(stderr, "  %s kubeconfig%s -server https://%s -o kubeconfig && kubectl --kubeconfig kubeconfig get nodes\n",
			self, config, net.JoinHostPort("127.0.0.1", strconv.Itoa(apiPort)))
	}
}
