package launch

import (
	"context"
	"fmt"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"time"

	"plinth.dev/plinth/platform/supervisor"
)

// Power and boot control of the nodes of a Cluster.

// start launches n's next boot.
func (c *Cluster) start(ctx context.Context, n *ClusterNode) error {
	n.mu.Lock()
	defer n.mu.Unlock()
	return c.startLocked(ctx, n)
}

func (c *Cluster) startLocked(ctx context.Context, n *ClusterNode) (err error) {
	if n.vm != nil {
		select {
		case <-n.vm.Exited():
		default:
			return fmt.Errorf("launch: %s is running", n.Name)
		}
		n.vm.Close()
	}
	n.boots++
	n.stopping = false
	o := c.opts.Image.NodeOptions(n.Name).WithParameters(n.params)
	o.DiskPath, o.DiskSizeBytes = filepath.Join(n.Dir, "disk.img"), c.opts.DiskSizeBytes
	if n.netboot {
		disk := o.DiskPath
		o = c.netbootOptions(n)
		o.DiskPath, o.DiskSizeBytes = disk, c.opts.DiskSizeBytes
	} else if n.diskBoot {
		if o, err = c.opts.Image.DiskBootOptions(n.Name, o.DiskPath, c.opts.DiskSizeBytes, n.params); err != nil {
			return err
		}
		o.UEFI = &UEFI{Vars: filepath.Join(n.Dir, "OVMF_VARS.fd")}
	}
	o.WorkDir = filepath.Join(n.Dir, "boot"+strconv.Itoa(n.boots))
	o.TPMStateDir = filepath.Join(n.Dir, "tpm")
	o.NoNetwork = true
	o.ExtraArgs = append(o.ExtraArgs, n.portArgs...)
	if c.opts.Console != nil {
		o.Console = c.opts.Console(n.Name)
	}
	o.Progress = c.opts.Progress
	if n.times.Launched.IsZero() {
		n.times.Launched = time.Now()
	}
	// The node outlives ctx, which bounds only the launch.
	vm, err := Launch(context.WithoutCancel(ctx), o)
	if err != nil {
		return err
	}
	n.vm = vm
	c.logf("%s: boot %d, console log %s", n.Name, n.boots, vm.ConsolePath())
	go c.watch(n, vm)
	return nil
}

// rebootLine is what init prints last before a reboot, or the kernel when
// the watchdog resets the machine.
var rebootLine = regexp.MustCompile(`handing over to PID 1 .*action=reboot|softdog: Initiating system reboot`)

// watch starts n again when its guest rebooted (QEMU exits on a reboot)
// and the harness did not stop it.
func (c *Cluster) watch(n *ClusterNode, vm *Node) {
	<-vm.Exited()
	c.mu.Lock()
	closed := c.closed
	c.mu.Unlock()
	n.mu.Lock()
	defer n.mu.Unlock()
	if closed || n.stopping || n.vm != vm {
		return
	}
	rebooted := slices.ContainsFunc(vm.Lines(), rebootLine.MatchString)
	if !rebooted {
		c.logf("%s: powered off (%s)", n.Name, vm.ExitStatus())
		return
	}
	c.logf("%s: rebooting", n.Name)
	if err := c.startLocked(context.Background(), n); err != nil {
		c.logf("%s: restarting after reboot: %v", n.Name, err)
	}
}

// StopNode powers n off (ACPI power button) and waits for it; after
// grace it is killed. It stays off until StartNode.
func (c *Cluster) StopNode(ctx context.Context, n *ClusterNode, grace time.Duration) error {
	n.mu.Lock()
	n.stopping = true
	vm := n.vm
	n.mu.Unlock()
	if vm == nil {
		return nil
	}
	pctx, cancel := context.WithTimeout(ctx, grace)
	defer cancel()
	if err := vm.PowerDown(pctx); err == nil {
		if vm.Wait(pctx) == nil {
			return nil
		}
	}
	return c.KillNode(n)
}

// KillNode cuts n's power. It stays off until StartNode.
func (c *Cluster) KillNode(n *ClusterNode) error {
	n.mu.Lock()
	n.stopping = true
	vm := n.vm
	n.mu.Unlock()
	if vm == nil {
		return nil
	}
	err := vm.Kill()
	<-vm.Exited()
	return err
}

// StartNode boots a stopped node again with the same disk, TPM and
// parameters.
func (c *Cluster) StartNode(ctx context.Context, n *ClusterNode) error {
	return c.start(ctx, n)
}

// RebootNode asks n to reboot through NodeManagement and waits until the
// harness has started its next boot (not until it is UP again).
func (c *Cluster) RebootNode(ctx context.Context, n *ClusterNode) error {
	old := n.VM()
	if n.ID() == "" {
		return fmt.Errorf("launch: %s has no node ID yet", n.Name)
	}
	if err := c.Client().Reboot(ctx, n.ID()); err != nil {
		return fmt.Errorf("launch: %s: reboot: %w", n.Name, err)
	}
	var exitedAt time.Time
	for {
		if n.VM() != old {
			return nil
		}
		select {
		case <-old.Exited():
			if exitedAt.IsZero() {
				exitedAt = time.Now()
			} else if time.Since(exitedAt) > 5*time.Second {
				return fmt.Errorf("launch: %s powered off instead of rebooting (%s)", n.Name, old.ExitStatus())
			}
		default:
		}
		if supervisor.Sleep(ctx, 200*time.Millisecond) != nil {
			return fmt.Errorf("launch: %s: waiting for the reboot: %w", n.Name, ctx.Err())
		}
	}
}
