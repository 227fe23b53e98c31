package main

import (
	"context"
	"crypto/ed25519"
	"crypto/rand"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"time"

	"github.com/spf13/pflag"

	"plinth.dev/plinth/api/nodepb"
	"plinth.dev/plinth/board"
	"plinth.dev/plinth/launch"
	"plinth.dev/plinth/platform/atomicfile"
	"plinth.dev/plinth/platform/layout"
	"plinth.dev/plinth/roleserver/owner"
	"plinth.dev/plinth/roleserver/parameters"
)

func init() {
	add(spec{path: "run", short: "Boot one node of a built image in QEMU with its own swtpm", group: groupImage,
		long: "Boot one node of a built image in QEMU, with its own swtpm, and stream its console.\n" +
			"The first run in a state directory writes bootstrap parameters with a fresh owner key\n" +
			"(saved as the owner configuration, --owner-dir) and prints the commands that take\n" +
			"ownership of the new cluster and reach it. The first Ctrl-C powers the node off, a\n" +
			"second one kills QEMU.",
		maxArgs: 0, new: func() command { return new(runCmd) }})
}

// runCmd is `plinthctl run`: it boots one node and streams its console.
// The first Ctrl-C asks the node to power off (ACPI power button), a
// second one kills QEMU.
//
// The node is on QEMU user networking (10.0.2.15); its curator and
// NodeManagement ports are forwarded from 127.0.0.1. On the first run the
// bootstrap parameters get a fresh owner key, saved as the owner
// configuration directory (--owner-dir) that plinthctl cluster
// takeownership and the cluster commands use.
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

func (c *runCmd) flags(fs *pflag.FlagSet) {
	fs.StringVar(&c.image, "image", "", "image `directory` (plinthctl build --out; default OUT/image/"+board.Default+", "+outHelp+")")
	fs.StringVar(&c.state, "state", "", "`directory` for the node's disk, TPM state and logs, kept between runs (default OUT/run/"+board.Default+")")
	fs.Int64Var(&c.diskSize, "disk-size", 4<<30, "size in `bytes` of the data disk file created on first run")
	fs.StringVar(&c.params, "params", "", "node parameters `file` (plinthctl params); default: STATE/parameters.pb, created on first run for a bootstrap node with a TPM")
	fs.StringVar(&c.ownerDir, "owner-dir", "", "owner configuration `dir` the first run writes the owner key to (default STATE/owner)")
	fs.IntVar(&c.curatorPort, "curator-port", layout.CuratorPort, "host `port` on 127.0.0.1 forwarded to the node's curator (0: none)")
	fs.IntVar(&c.mgmtPort, "mgmt-port", layout.NodeManagementPort, "host `port` on 127.0.0.1 forwarded to the node's NodeManagement (0: none)")
	fs.IntVar(&c.apiPort, "kubernetes-port", layout.KubernetesAPIPort, "host `port` on 127.0.0.1 forwarded to the node's Kubernetes API server (0: none)")
}

// defaults fills in the directories not given: under OUT, and the owner
// configuration in the state directory.
func (c *runCmd) defaults() {
	if c.image == "" {
		c.image = filepath.Join(outDir(), "image", board.Default)
	}
	if c.state == "" {
		c.state = filepath.Join(outDir(), "run", board.Default)
	}
	if c.ownerDir == "" {
		c.ownerDir = filepath.Join(c.state, "owner")
	}
}

func (c *runCmd) run(ctx context.Context, e *env, _ []string) error {
	stdout, stderr := e.stdout, e.stderr
	c.defaults()
	img, err := launch.LoadImage(c.image)
	if err != nil {
		return err
	}
	if err := os.MkdirAll(filepath.Join(c.state, "tpm"), 0o755); err != nil {
		return err
	}
	params, err := c.nodeParameters(stderr)
	if err != nil {
		return err
	}
	o := img.NodeOptions("node").WithParameters(c.params)
	o.WorkDir = c.state
	o.DiskPath, o.DiskSizeBytes = filepath.Join(c.state, "disk.img"), c.diskSize
	o.TPMStateDir = filepath.Join(c.state, "tpm")
	o.Console = stdout
	for _, f := range []launch.Forward{{HostPort: c.curatorPort, GuestPort: layout.CuratorPort}, {HostPort: c.mgmtPort, GuestPort: layout.NodeManagementPort},
		{HostPort: c.apiPort, GuestPort: layout.KubernetesAPIPort}} {
		if f.HostPort != 0 {
			o.HostForwards = append(o.HostForwards, f)
		}
	}

	fmt.Fprintf(stderr, "plinthctl: booting %s (kernel %s, %s acceleration); console log in %s; Ctrl-C powers the node off\n",
		img.Manifest.Board, img.Manifest.KernelVersion, accel(), filepath.Join(c.state, "console.log"))
	g := runGuide{self: selfCommand(), state: c.state, ownerDir: c.ownerDir, params: params, paramsFile: c.params,
		curatorPort: c.curatorPort, mgmtPort: c.mgmtPort, apiPort: c.apiPort, kvm: launch.KVMAvailable()}
	g.kubectl = projectKubectl(g.self)
	g.owner, g.ownerErr = owner.LoadConfig(c.ownerDir)
	g.write(stderr)
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

// nodeParameters returns the node's parameters document: --params, else
// STATE/parameters.pb, written on the first run (firstRunParameters). An
// existing node's document is read, never rewritten: its disk and TPM
// were set up with it.
func (c *runCmd) nodeParameters(stderr io.Writer) (*nodepb.Parameters, error) {
	if c.params == "" {
		c.params = filepath.Join(c.state, "parameters.pb")
		if _, err := os.Stat(c.params); os.IsNotExist(err) {
			if err := firstRunParameters(stderr, c.params, c.ownerDir); err != nil {
				return nil, err
			}
		}
	}
	raw, err := os.ReadFile(c.params)
	if err != nil {
		return nil, err
	}
	p, err := parameters.Decode(raw)
	if err != nil {
		return nil, fmt.Errorf("%s: %w (the node would refuse it too; nothing was started)", c.params, err)
	}
	return p, nil
}

// rebootLine is what init prints last before a reboot (the launcher's too).
var rebootLine = regexp.MustCompile(`handing over to PID 1 .*action=reboot`)

// bootOnce runs one boot of the node until QEMU exits, and reports
// whether the guest rebooted.
func bootOnce(ctx context.Context, stderr io.Writer, o launch.NodeOptions) (bool, error) {
	o.Progress = stderr
	// The node must outlive the first Ctrl-C, which only asks it to stop.
	n, err := launch.Launch(context.WithoutCancel(ctx), o)
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

// firstRunParameters writes the parameters of a node that founds a new
// cluster with a fresh owner key, and saves the key in ownerDir, refusing
// to replace an existing key. They are a node's defaults
// (parameters.NewBootstrap: consensus member, Kubernetes controller and
// worker) plus the one thing a QEMU -kernel boot needs: firmware does not
// measure that kernel, so the node may seal its first keys on an
// unmeasured boot (plinthctl params --bootstrap leaves this off, as real
// machines boot measured).
func firstRunParameters(stderr io.Writer, paramsFile, ownerDir string) error {
	if _, err := os.Stat(filepath.Join(ownerDir, owner.KeyFile)); err == nil {
		return fmt.Errorf("%s already holds an owner key (of an earlier node?): move it away or pass --owner-dir", ownerDir)
	}
	pub, key, err := ed25519.GenerateKey(rand.Reader)
	if err != nil {
		return err
	}
	raw, err := parameters.Encode(runParameters(pub))
	if err != nil {
		return err
	}
	if err := (&owner.Config{Dir: ownerDir, Key: key}).Save(); err != nil {
		return err
	}
	fmt.Fprintf(stderr, "plinthctl: first run: writing bootstrap parameters to %s, owner key to %s\n",
		paramsFile, filepath.Join(ownerDir, owner.KeyFile))
	if err := atomicfile.Write(paramsFile, raw, 0o644); err != nil {
		os.Remove(filepath.Join(ownerDir, owner.KeyFile))
		return err
	}
	return nil
}

// runParameters are the first run's parameters for owner.
func runParameters(owner ed25519.PublicKey) *nodepb.Parameters {
	p := parameters.NewBootstrap(owner)
	p.Tpm.AllowUnmeasuredBoot = true
	return p
}

// selfCommand is how the user calls this plinthctl: as typed if it was
// called by a path (make run's out/bin/plinthctl), "go run
// ./cmd/plinthctl" under go run, else by its name on PATH.
func selfCommand() string {
	switch {
	case strings.Contains(os.Args[0], "go-build"):
		return "go run ./cmd/plinthctl"
	case strings.Contains(os.Args[0], "/"):
		return os.Args[0]
	}
	return "plinthctl"
}

// projectKubectl is the kubectl built from the nodes' Kubernetes version
// next to plinthctl (make builds both into out/bin), else kubectl on PATH.
func projectKubectl(self string) string {
	if strings.Contains(self, "/") && !strings.Contains(self, " ") {
		k := filepath.Join(filepath.Dir(self), "kubectl")
		if _, err := os.Stat(k); err == nil {
			return k
		}
	}
	return "kubectl"
}
