package main

import (
	"context"
	"errors"
	"sync/atomic"
	"time"

	"golang.org/x/sys/unix"

	"plinth.dev/plinth/platform/kmod"
	"plinth.dev/plinth/platform/layout"
	"plinth.dev/plinth/platform/network"
	"plinth.dev/plinth/platform/nodenames"
	"plinth.dev/plinth/platform/power"
	"plinth.dev/plinth/platform/reaper"
	datadisk "plinth.dev/plinth/platform/storage"
	"plinth.dev/plinth/platform/supervisor"
	"plinth.dev/plinth/roleserver"
	"plinth.dev/plinth/roleserver/enrolment"
	"plinth.dev/plinth/roleserver/kubernetes"
)

// The running node: the supervisor tree the boot hands over to.
//
//	root ──┬── power        (the power button ─► shutdown)
//	       ├── network
//	       ├── enrolment    enrolment.New(…, roles): feeds the Role Server,
//	       │                follows its Directory and ClusterKey
//	       └── roleserver   roleserver.New(…): NodeManagement Reboot and
//	                        PowerOff ─► shutdown
//
// Each is built before the tree starts, each from what exists already:
// nothing is handed a value that is set later.

// node is the running node: the boot it comes from, and what it adds.
type node struct {
	*boot
	// shutdown receives the first shutdown request: PID 1's exit code.
	shutdown chan int
	// volume is the open data volume, for an update's reseal: the one
	// the boot opened, or the one enrolment opens for a registering node.
	volume atomic.Pointer[datadisk.Result]
	// names is the node ID → address map the Role Server keeps and this
	// process resolves node IDs through.
	names *nodenames.Table
}

// runNode runs the supervisor tree until a shutdown request, then stops
// it, closes the data volume and returns PID 1's exit code.
func runNode(b *boot) int {
	n := &node{boot: b, shutdown: make(chan int, 1), names: nodenames.NewTable()}
	// etcd finds its peers by node ID: from the Role Server's map, never
	// through /etc/hosts, which pods may mount (platform/nodenames).
	nodenames.Install(n.names)
	if b.volume != nil {
		n.volume.Store(b.volume)
	}
	net := network.New(n.networkConfig())
	roles := roleserver.New(n.roleServerConfig(net))
	enrol := enrolment.New(n.enrolmentConfig(net), roles)
	if n.chip != nil {
		n.updates.Reseal = func() error { return n.reseal(enrol) }
	}
	watchTrial(n.l, n.updates, func() { n.requestShutdown(reaper.ExitReboot) })
	ctx, cancel := context.WithCancel(context.Background())
	sup := supervisor.New(ctx, n.logs, n.tree(net, enrol, roles), supervisor.Options{})
	go reportReadiness(ctx, n.l, sup)
	go confirmWhenReady(ctx, n.l, sup, n.updates, n.disk.Disk)
	code, corrupt := waitForShutdownRequest(n.l, n.shutdown, n.imageBad)
	return n.stop(cancel, sup, code, corrupt)
}

// requestShutdown asks for a shutdown with PID 1's exit code; only the
// first request counts.
func (n *node) requestShutdown(code int) {
	select {
	case n.shutdown <- code:
	default:
	}
}

// networkConfig is the network service's configuration from the node
// parameters.
func (n *node) networkConfig() network.Config {
	c, err := networkConfig(n.params)
	if err != nil {
		// Validated parameters cannot get here; keep DHCP rather than no network.
		n.l.Error("static network configuration unusable, using DHCP", "err", err)
	}
	return c
}

func (n *node) roleServerConfig(net *network.Service) roleserver.Config {
	return roleserver.Config{
		StorageRoot:  n.local,
		Network:      net,
		LogTree:      n.logs,
		BootProblems: unmeasuredProblem(n.firmware),
		Version:      n.version,
		BootTime:     bootTime(),
		Names:        n.names,
		Power: func(reboot bool) {
			if reboot {
				n.requestShutdown(reaper.ExitReboot)
			} else {
				n.requestShutdown(reaper.ExitPowerOff)
			}
		},
		ResolvConf:            "/run/resolv.conf",
		LoadKubernetesModules: n.loadKubernetesModules,
		StopPods:              kubernetes.StopPods,
		CuratorEndpoints:      n.params.Params.GetRegister().GetCuratorEndpoints(),
		Updates:               n.updates,
	}
}

func (n *node) loadKubernetesModules() error {
	loaded, _, err := kmod.LoadList(moduleDir(), layout.KubernetesModuleLoadList)
	if err == nil {
		n.l.Info("Kubernetes kernel modules loaded", "modules", len(loaded))
	}
	return err
}

func (n *node) enrolmentConfig(net *network.Service) enrolment.Config {
	return enrolment.Config{
		Parameters:   n.params.Params,
		Root:         n.local,
		Keys:         n.keys,
		TPMUsage:     tpmUsage(n.chip),
		Disk:         n.disk,
		VolumeOpened: n.enrolmentOpenedVolume,
		Network:      net,
		Version:      n.version,
		BootTime:     bootTime(),
	}
}

// enrolmentOpenedVolume finishes what enrolment's opening of a
// registering node's volume starts, as the boot does for the others.
func (n *node) enrolmentOpenedVolume(r *datadisk.Result) error {
	n.volume.Store(r)
	_, err := volumeOpened(n.l, n.chip, n.local, r)
	return err
}

// reseal seals the node's keys again for an A/B update
// (update.Node.Reseal): the volume's node unlock key, then enrolment's
// join state.
func (n *node) reseal(enrol *enrolment.Service) error {
	v := n.volume.Load()
	if v == nil {
		return errors.New("the data volume is not open yet")
	}
	if err := v.ResealNodeKey(n.keys); err != nil {
		return err
	}
	return enrol.Reseal()
}

// tree is the supervisor's root runnable.
func (n *node) tree(net *network.Service, enrol *enrolment.Service, roles *roleserver.Service) supervisor.Runnable {
	return func(ctx context.Context) error {
		for _, r := range []struct {
			name string
			run  supervisor.Runnable
		}{
			{"power", power.WatchButton(func() { n.requestShutdown(reaper.ExitPowerOff) })},
			{"network", net.Run},
			{"enrolment", enrol.Run},
			{"roleserver", roles.Run},
		} {
			if err := supervisor.Run(ctx, r.name, r.run); err != nil {
				return err
			}
		}
		supervisor.Signal(ctx, supervisor.SignalHealthy)
		<-ctx.Done()
		return ctx.Err()
	}
}

// stop stops the tree (cancel), waits for it, closes the data volume and
// says what PID 1 does: code, or a halt if the system image is corrupt.
func (n *node) stop(cancel context.CancelFunc, sup *supervisor.Supervisor, code int, corrupt error) int {
	if corrupt != nil {
		n.l.Error("halting: the system image is corrupt; stopping all runnables")
	} else {
		n.l.Info("shutting down: stopping all runnables")
	}
	cancel()
	stopped := make(chan struct{})
	go func() { sup.Wait(); close(stopped) }()
	select {
	case <-stopped:
		n.l.Info("all runnables stopped")
	case <-time.After(15 * time.Second):
		n.l.Error("runnables still running after 15s, going down anyway", "still", notStopped(sup))
	}
	closeDataVolume(n.l, n.local)
	unix.Sync()
	if corrupt != nil {
		n.l.Error(imageHaltedMessage)
		return waitForPowerOff(n.logs)
	}
	n.l.Info("filesystems synced, handing over to PID 1", "action", map[int]string{reaper.ExitPowerOff: "power off", reaper.ExitReboot: "reboot"}[code])
	return code
}
