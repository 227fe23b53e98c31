package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"slices"
	"sync"
	"time"

	"github.com/spf13/pflag"

	"plinth.dev/plinth/api/clusterpb"
	"plinth.dev/plinth/platform/releasekeys"
	"plinth.dev/plinth/roleserver/owner"
)

func init() {
	add(spec{path: "node update", args: "NODE", short: "Install a new image on a node (A/B) and reboot it into it",
		long: "Install the image in --image on NODE's inactive slot and reboot it into it, waiting until\n" +
			"it is back healthy on the new version. --stage and --no-reboot install only; --activate\n" +
			"and --cancel boot or drop an installed update.",
		minArgs: 1, maxArgs: 1, new: func() command { return new(updateCmd) }})
	add(spec{path: "cluster update", short: "Install a new image on every node, one at a time",
		long: "Update every node that is up, one at a time: nodes that are not consensus members\n" +
			"first, each healthy on the new version before the next reboots (the next installs\n" +
			"meanwhile). --stage installs everywhere without rebooting; then plinthctl node update\n" +
			"NODE --activate boots each.",
		maxArgs: 0, new: func() command { return &updateCmd{all: true} }})
}

// updateCmd is `plinthctl node update NODE --image DIR` and `plinthctl
// cluster update --image DIR` (all); --stage, --activate and --cancel
// split an update into its install and its reboot.
type updateCmd struct {
	all      bool // every node: cluster update
	image    string
	noReboot bool
	stage    bool
	activate bool
	cancel   bool
	version  string
	timeout  time.Duration
	// drain: Kubernetes workers are cordoned and drained first (through
	// kubeServer, host:port, if set) and uncordoned after.
	drain      bool
	kubeServer string
	// allowDowngrade: install an image older than the node's (an
	// emergency: going back to the last release that worked), with a
	// downgrade statement signed by signKey, valid for downgradeValid.
	allowDowngrade bool
	signKey        string
	downgradeValid time.Duration
}

func (c *updateCmd) flags(fs *pflag.FlagSet) {
	fs.StringVar(&c.image, "image", "", "image `dir`ectory (the builder's output: manifest.json, system.img, UKIs)")
	fs.BoolVar(&c.noReboot, "no-reboot", false, "install only: the node boots the new slot at its next reboot")
	fs.BoolVar(&c.stage, "stage", false, "install only, staged: nothing boots it before --activate (or --cancel drops it)")
	fs.BoolVar(&c.activate, "activate", false, "reboot NODE into its staged update and wait as for an update")
	fs.BoolVar(&c.cancel, "cancel", false, "drop NODE's installed update that was not booted yet; its keys are sealed to the running slot alone")
	fs.StringVar(&c.version, "version", "", "with --activate or --cancel: only if the update is this `version`")
	fs.DurationVar(&c.timeout, "timeout", 20*time.Minute, "how long to wait for a node to come back healthy on the new version")
	fs.BoolVar(&c.drain, "drain", true, "cordon and drain a Kubernetes worker before it reboots into its update (its pods move to other workers), uncordon it after")
	fs.StringVar(&c.kubeServer, "kube-server", "", "Kubernetes API server `host:port` for --drain (default: the first the cluster names)")
	fs.BoolVar(&c.allowDowngrade, "allow-downgrade", false, "install the image even if its release is older than the node's (emergencies; the node logs it), with a downgrade statement signed by --sign-key. The image must still be signed by a release key of the cluster")
	fs.StringVar(&c.signKey, "sign-key", "", "with --allow-downgrade: a release key `file` of the cluster (plinthctl release key) that signs the downgrade statement")
	fs.DurationVar(&c.downgradeValid, "downgrade-valid", time.Hour, "with --allow-downgrade: how long nodes accept the downgrade statement (at most a week)")
	if c.all {
		// Parsed, to be refused with what to run instead (check).
		for _, name := range []string{"activate", "cancel", "version"} {
			fs.MarkHidden(name)
		}
	}
}

func (c *updateCmd) run(ctx context.Context, e *env, args []string) error {
	if err := c.check(); err != nil {
		return err
	}
	cl, err := e.dial()
	if err != nil {
		return err
	}
	defer cl.Close()
	// Whole lines: a rolling update's next node reports as it installs.
	mu := new(sync.Mutex)
	out := &prefixWriter{mu: mu, w: e.stdout}
	if c.activate || c.cancel {
		return c.activateOrCancel(ctx, cl, args[0], out)
	}
	img, err := c.readImage(e.stderr)
	if err != nil {
		return err
	}
	var ids []string
	if c.all {
		if ids, err = updateOrder(ctx, cl); err != nil {
			return err
		}
	} else {
		id, err := nodeID(ctx, cl, args[0])
		if err != nil {
			return err
		}
		ids = []string{id}
	}
	if c.all && !c.stage {
		return c.rolling(ctx, cl, ids, img, out, func(i int) io.Writer {
			return &prefixWriter{mu: mu, w: e.stdout, prefix: fmt.Sprintf("  [%d/%d %s]", i+1, len(ids), ids[i])}
		})
	}
	return c.oneByOne(ctx, cl, ids, img, out)
}

// check refuses combinations of flags that say no one thing to do, as
// wrong usage.
func (c *updateCmd) check() error {
	finishing := c.activate || c.cancel
	switch {
	case c.all && finishing:
		return usagef("--activate and --cancel act on one node's installed update: run plinthctl node update NODE --activate (or --cancel)")
	case c.activate && c.cancel:
		return usagef("--activate boots the installed update, --cancel drops it: give one of them")
	case c.image == "" && !finishing:
		return usagef("nothing to install: give --image DIR (or, for an update already installed, --activate or --cancel)")
	case c.image != "" && finishing:
		return usagef("--image installs an update, --activate and --cancel act on one already installed: give --image or one of them")
	case finishing && (c.stage || c.noReboot):
		return usagef("--activate and --cancel act on NODE's installed update: --stage and --no-reboot go with --image")
	case finishing && c.allowDowngrade:
		return usagef("--allow-downgrade goes with --image: the node checks an image's release when it is installed, not when it is activated or cancelled")
	case c.allowDowngrade != (c.signKey != ""):
		return usagef("--allow-downgrade needs --sign-key: only a release key of the cluster can allow a node to go back (and --sign-key signs nothing else here)")
	case c.stage && c.noReboot:
		return usagef("--stage and --no-reboot exclude each other: a staged update waits for --activate, the other boots at the next reboot")
	case c.all && c.noReboot:
		return usagef("plinthctl cluster update updates one node after another and needs each to reboot: it cannot be combined with --no-reboot (--stage installs everywhere)")
	}
	return nil
}

// activateOrCancel is --activate and --cancel: node's installed update is
// booted (and waited for as an update) or dropped.
func (c *updateCmd) activateOrCancel(ctx context.Context, cl *owner.Client, node string, out io.Writer) error {
	id, err := nodeID(ctx, cl, node)
	if err != nil {
		return err
	}
	if !c.cancel {
		return c.finish(ctx, cl, id, c.version, time.Now(), out)
	}
	cctx, cancel := context.WithTimeout(ctx, callTimeout)
	defer cancel()
	r, err := cl.CancelUpdate(cctx, id, c.version)
	if err != nil {
		return err
	}
	fmt.Fprintf(out, "%s: the update to %s in slot %s is cancelled\n", id, r.GetVersion(), r.GetSlot())
	return nil
}

// readImage reads the --image directory, saying on stderr what the nodes
// will be told about it.
func (c *updateCmd) readImage(stderr io.Writer) (*owner.UpdateImage, error) {
	img, err := owner.ReadUpdateImage(c.image)
	if err != nil {
		return nil, err
	}
	if img.Signature == nil {
		// Sent all the same: the node's policy decides, and says why.
		fmt.Fprintf(stderr, "plinthctl: %s has no manifest.sig: the image is unsigned (plinthctl build --sign-key signs it)\n", c.image)
	}
	if c.allowDowngrade {
		key, err := readReleaseKey(c.signKey)
		if err != nil {
			return nil, fmt.Errorf("--sign-key: %w", err)
		}
		body, err := releasekeys.NewDowngrade(img.Release, time.Now(), c.downgradeValid)
		if err != nil {
			return nil, fmt.Errorf("--downgrade-valid: %w", err)
		}
		img.Downgrade = clusterpb.NewSignedStatement(releasekeys.Sign(body, key))
		fmt.Fprintf(stderr, "plinthctl: --allow-downgrade: nodes install release %d even if they run a newer one, for %v, if %s is one of the cluster's release keys\n",
			img.Release, c.downgradeValid, c.signKey)
	}
	return img, nil
}

// oneByOne installs img on ids in turn: staged (--stage), for the next
// boot (--no-reboot), or booted and waited for before the next.
func (c *updateCmd) oneByOne(ctx context.Context, cl *owner.Client, ids []string, img *owner.UpdateImage, out io.Writer) error {
	mode := owner.UpdateStage
	if c.noReboot {
		mode = owner.UpdateNextBoot
	}
	for i, id := range ids {
		if len(ids) > 1 {
			fmt.Fprintf(out, "[%d/%d] %s\n", i+1, len(ids), id)
		}
		started := time.Now()
		done, err := c.install(ctx, cl, id, img, mode, out)
		switch {
		case err != nil && len(ids) > 1:
			return fmt.Errorf("staging stopped at node %d of %d (%s); the nodes before it have %s staged: %w", i+1, len(ids), id, img.Version, err)
		case err != nil:
			return err
		case c.noReboot:
			fmt.Fprintf(out, "  the node boots it once at its next reboot, and keeps it when healthy\n")
		case c.stage:
			fmt.Fprintf(out, "  staged: `plinthctl node update %s --activate` boots it, --cancel drops it\n", id)
		default:
			if err := c.finish(ctx, cl, id, done.GetVersion(), started, out); err != nil {
				return err
			}
		}
	}
	return nil
}

// rolling updates ids one at a time: each node is staged while the one
// before it reboots into its update, then activated once that one is
// healthy on the new version. At the first failure it stops, cancels the
// next node's staged update and says where.
func (c *updateCmd) rolling(ctx context.Context, cl *owner.Client, ids []string, img *owner.UpdateImage, out io.Writer, outOf func(i int) io.Writer) error {
	type staged struct {
		started time.Time
		err     error
	}
	stage := func(i int) <-chan staged {
		ch := make(chan staged, 1)
		go func() {
			started := time.Now()
			_, err := c.install(ctx, cl, ids[i], img, owner.UpdateStage, outOf(i))
			ch <- staged{started, err}
		}()
		return ch
	}
	stopped := func(i int, err error) error {
		before := fmt.Sprintf("the nodes before it run %s", img.Version)
		if i == 0 {
			before = fmt.Sprintf("no node runs %s", img.Version)
		}
		return fmt.Errorf("rolling update stopped at node %d of %d (%s); %s, the nodes after it run what they ran: %w", i+1, len(ids), ids[i], before, err)
	}
	next := stage(0)
	for i, id := range ids {
		fmt.Fprintf(out, "[%d/%d] %s\n", i+1, len(ids), id)
		st := <-next
		if st.err != nil {
			return stopped(i, st.err)
		}
		next = nil
		if i+1 < len(ids) {
			// Installing disturbs nothing: the next node writes its
			// inactive slot while this one reboots.
			next = stage(i + 1)
		}
		if err := c.finish(ctx, cl, id, img.Version, st.started, out); err != nil {
			if next != nil {
				if st := <-next; st.err == nil {
					cctx, cancel := context.WithTimeout(ctx, callTimeout)
					_, cerr := cl.CancelUpdate(cctx, ids[i+1], img.Version)
					cancel()
					if cerr != nil {
						err = errors.Join(err, fmt.Errorf("cancelling the update staged on %s: %w", ids[i+1], cerr))
					} else {
						fmt.Fprintf(out, "  the update staged on %s is cancelled\n", ids[i+1])
					}
				}
			}
			return stopped(i, err)
		}
	}
	return nil
}

// updateOrder is the order of a rolling update: nodes that are not
// consensus members first, then the members, so the quorum is touched
// last and one member at a time.
func updateOrder(ctx context.Context, cl *owner.Client) ([]string, error) {
	ctx, cancel := context.WithTimeout(ctx, callTimeout)
	defer cancel()
	nodes, err := cl.Nodes(ctx)
	if err != nil {
		return nil, err
	}
	var workers, members []string
	for _, n := range nodes {
		if n.GetState() != clusterpb.NodeState_NODE_STATE_UP {
			continue
		}
		if n.GetRoles().GetConsensusMember() != nil {
			members = append(members, n.GetId())
		} else {
			workers = append(workers, n.GetId())
		}
	}
	slices.Sort(workers)
	slices.Sort(members)
	return append(workers, members...), nil
}

// progressEvery paces an install's byte counts.
const progressEvery = 5 * time.Second

// install sends img to node id and has it installed in mode, printing
// the node's progress to out.
func (c *updateCmd) install(ctx context.Context, cl *owner.Client, id string, img *owner.UpdateImage, mode owner.UpdateMode, out io.Writer) (*clusterpb.UpdateDone, error) {
	started := time.Now()
	// A line per phase, then for each at most one every progressEvery
	// (sending and writing report in turn, from two goroutines).
	var mu sync.Mutex
	said := map[string]time.Time{}
	done, err := cl.Update(ctx, id, img, mode, func(p *clusterpb.UpdateProgress) {
		mu.Lock()
		defer mu.Unlock()
		last, ok := said[p.GetPhase()]
		if ok && time.Since(last) < progressEvery && p.GetDoneBytes() != p.GetTotalBytes() {
			return
		}
		said[p.GetPhase()] = time.Now()
		if p.GetTotalBytes() > 0 && p.GetDoneBytes() > 0 {
			fmt.Fprintf(out, "  %s: %d/%d MiB\n", p.GetPhase(), p.GetDoneBytes()>>20, p.GetTotalBytes()>>20)
		} else {
			fmt.Fprintf(out, "  %s\n", p.GetPhase())
		}
	})
	var refused *owner.RefusedError
	if errors.As(err, &refused) {
		// It names the node and the node's reason.
		return nil, err
	}
	if err != nil {
		return nil, fmt.Errorf("update of %s: %w", id, err)
	}
	fmt.Fprintf(out, "  %s installed in slot %s in %s\n", done.GetVersion(), done.GetSlot(), time.Since(started).Round(time.Second))
	return done, nil
}

// finish reboots node id into its staged update of version (any if
// empty) and waits until it is back, healthy, on the new version (and a
// voting consensus member again if it was one). A Kubernetes worker is
// drained first and uncordoned after. since is when the update began.
func (c *updateCmd) finish(ctx context.Context, cl *owner.Client, id, version string, since time.Time, out io.Writer) error {
	before, err := cl.FindNode(ctx, id)
	if err != nil {
		return err
	}
	var kube *owner.KubeAPI
	if c.drain && before.GetRoles().GetKubernetesWorker() != nil {
		if kube, err = c.cordonAndDrain(ctx, cl, id, out); err != nil {
			return err
		}
	}
	actx, cancel := context.WithTimeout(ctx, callTimeout)
	done, err := cl.ActivateUpdate(actx, id, version, true)
	cancel()
	if err != nil {
		// Not activated: the node runs its slot as before and may run
		// pods again.
		if kube != nil {
			err = errors.Join(err, kube.Cordon(ctx, id, false))
		}
		return fmt.Errorf("activating the update of %s: %w", id, err)
	}
	voter := before.GetConsensusMembership() == clusterpb.ConsensusMembership_CONSENSUS_MEMBERSHIP_VOTER
	err = waitUpdated(ctx, cl, id, done, voter, before.GetStatus().GetSoftware().GetLastFailed(), since, c.timeout, out)
	// Back and healthy, on the new slot or (a failed update) the old one:
	// it may run pods again.
	var failed *updateFailedError
	if kube != nil && err == nil {
		// Its kubelet, of the new image, must be back before its pods
		// are: else the next worker's would have nowhere to go.
		if err := waitKubernetesReady(ctx, kube, id, c.timeout, out); err != nil {
			return err
		}
	}
	if kube != nil && (err == nil || errors.As(err, &failed)) {
		if uerr := kube.Cordon(ctx, id, false); uerr != nil {
			return errors.Join(err, fmt.Errorf("uncordoning %s: %w", id, uerr))
		}
		fmt.Fprintf(out, "  uncordoned\n")
	}
	return err
}
