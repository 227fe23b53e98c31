// Package supervisor runs the node's long-running work as a tree of named
// runnables, restarts what fails and tells whether everything is healthy.
//
// A node's tree (the DNs `plinthctl node status` and `plinthctl node logs
// --dn` show), with every role:
//
//	root ──┬── enrolment ──┬── clusterkey  (enrolment is done once the node has a
//	       │               └── directory    cluster identity; these keep its join state)
//	       ├── network
//	       ├── power
//	       └── roleserver ──┬── controlplane ──┬── consensus ──┬── autopromoter
//	                        │                  │               └── crl
//	                        │                  └── curator ──── members
//	                        ├── heartbeat, hosts, nodemgmt, policyfetch, rolefetch, statuspush
//	                        └── kubernetes ──┬── controller ──┬── etcd (the confined endpoint)
//	                                         │                ├── apiserver, controller-manager, scheduler
//	                                         │                └── policy, rbac, nodeipam
//	                                         └── worker ──┬── apiproxy, containerd, images
//	                                                      └── kubelet, proxy, netd, dns
//
// A runnable is a plain func(ctx) error. It starts its children with Run,
// reports readiness with Signal(ctx, SignalHealthy), and returns:
//   - an error (or panics): it and its whole subtree are cancelled, waited
//     for, and it is started again after an exponential backoff;
//   - nil: it is done; children it started keep running;
//   - when ctx is cancelled (its parent died or the node shuts down): it
//     must return promptly; its return value is then ignored.
//
// Every runnable has a logger (Logger(ctx)) named by its place in the tree,
// e.g. "root.network.dhcp", writing into the node's logtree.
package supervisor

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"runtime/debug"
	"sort"
	"strings"
	"sync"
	"time"

	"plinth.dev/plinth/platform/logtree"
)

// Runnable is one unit of supervised work.
type Runnable func(ctx context.Context) error

// SignalType is what a runnable reports about itself.
type SignalType int

const (
	// SignalHealthy: the runnable finished starting and serves.
	SignalHealthy SignalType = iota
	// SignalDone: the runnable will return nil soon and counts as healthy.
	SignalDone
)

// State of one runnable.
type State string

const (
	StateStarting State = "STARTING"
	StateHealthy  State = "HEALTHY"
	StateDone     State = "DONE"
	StateBackoff  State = "BACKOFF"
	StateStopped  State = "STOPPED"
)

// Options tune restart behaviour.
type Options struct {
	// InitialBackoff is the first delay before a restart (default 100ms);
	// it doubles per consecutive failure up to MaxBackoff (default 30s).
	InitialBackoff, MaxBackoff time.Duration
	// ResetAfter: a runnable healthy for this long gets its backoff reset
	// (default 1 minute).
	ResetAfter time.Duration
}

// Supervisor owns one tree.
type Supervisor struct {
	opts Options
	lt   *logtree.Tree
	root *node

	mu      sync.Mutex
	changed chan struct{} // closed and replaced on every state change
	all     sync.WaitGroup
}

type node struct {
	s        *Supervisor
	dn       string
	parent   *node
	runnable Runnable

	// guarded by s.mu
	state    State
	children map[string]*node
	restarts int
	failures int // in a row: since it last stayed healthy ResetAfter
	lastErr  error
	healthy  time.Time
	pid      int // the child process RunCommand runs now, 0 if none

	// generation is cancelled when the runnable dies, taking its subtree down.
	genCancel context.CancelFunc
	genWG     *sync.WaitGroup
}

type ctxKey struct{}

// New starts root under the name "root". Cancelling ctx stops the tree;
// Wait returns once every runnable returned.
func New(ctx context.Context, lt *logtree.Tree, root Runnable, opts Options) *Supervisor {
	if opts.InitialBackoff == 0 {
		opts.InitialBackoff = 100 * time.Millisecond
	}
	if opts.MaxBackoff == 0 {
		opts.MaxBackoff = 30 * time.Second
	}
	if opts.ResetAfter == 0 {
		opts.ResetAfter = time.Minute
	}
	s := &Supervisor{opts: opts, lt: lt, changed: make(chan struct{})}
	s.root = &node{s: s, dn: "root", runnable: root, state: StateStarting, children: map[string]*node{}}
	s.all.Add(1)
	go s.root.loop(ctx, &s.all)
	return s
}

// Wait blocks until every runnable has returned (after ctx cancellation).
func (s *Supervisor) Wait() { s.all.Wait() }

// Run starts a child runnable of the runnable owning ctx. Names are unique
// among siblings and must not contain dots.
func Run(ctx context.Context, name string, r Runnable) error {
	parent, ok := ctx.Value(ctxKey{}).(*node)
	if !ok {
		return errors.New("supervisor.Run called outside a supervised runnable")
	}
	if name == "" || strings.ContainsAny(name, ". ") {
		return fmt.Errorf("invalid runnable name %q", name)
	}
	s := parent.s
	s.mu.Lock()
	if _, dup := parent.children[name]; dup {
		s.mu.Unlock()
		return fmt.Errorf("runnable %s.%s already exists", parent.dn, name)
	}
	n := &node{s: s, dn: parent.dn + "." + name, parent: parent, runnable: r, state: StateStarting, children: map[string]*node{}}
	parent.children[name] = n
	wg := parent.genWG
	wg.Add(1)
	s.all.Add(1)
	s.notifyLocked()
	s.mu.Unlock()
	go func() {
		defer s.all.Done()
		n.loop(ctx, wg)
	}()
	return nil
}

// Signal reports the state of the runnable owning ctx.
func Signal(ctx context.Context, sig SignalType) {
	n, ok := ctx.Value(ctxKey{}).(*node)
	if !ok {
		return
	}
	n.s.mu.Lock()
	defer n.s.mu.Unlock()
	switch sig {
	case SignalHealthy:
		if n.state != StateHealthy {
			n.healthy = time.Now()
		}
		n.state = StateHealthy
	case SignalDone:
		n.state = StateDone
	}
	n.s.notifyLocked()
}

// Logger returns the logger of the runnable owning ctx.
func Logger(ctx context.Context) *slog.Logger {
	if n, ok := ctx.Value(ctxKey{}).(*node); ok {
		return n.s.lt.Logger(n.dn)
	}
	return slog.Default()
}

// Snapshot returns the status of every runnable of the tree that owns
// ctx (as (*Supervisor).Snapshot), nil outside a supervised runnable. A
// runnable that reports the node's runnables (its status API) reads them
// through its own context, so nobody hands it the Supervisor, which
// exists only once the tree it is part of has been started.
func Snapshot(ctx context.Context) []Status {
	if n, ok := ctx.Value(ctxKey{}).(*node); ok {
		return n.s.Snapshot()
	}
	return nil
}

// ErrRestart, returned (wrapped) by a runnable, restarts it and its subtree
// at once, as a planned step rather than a failure: the way for a runnable
// to stop children it no longer needs (e.g. etcd when a role is removed),
// since children only stop with their parent.
var ErrRestart = errors.New("restart requested")

// loop runs one node until its parent context ends, restarting on failure.
// parentWG is the wait group of the parent's generation.
func (n *node) loop(parentCtx context.Context, parentWG *sync.WaitGroup) {
	defer parentWG.Done()
	log := n.s.lt.Logger(n.dn)
	backoff := n.s.opts.InitialBackoff
	for {
		genCtx, cancel := context.WithCancel(parentCtx)
		wg := &sync.WaitGroup{}
		n.s.mu.Lock()
		n.genCancel, n.genWG = cancel, wg
		n.state = StateStarting
		n.s.notifyLocked()
		n.s.mu.Unlock()

		err := n.call(context.WithValue(genCtx, ctxKey{}, n))

		if parentCtx.Err() != nil {
			// Shutdown or parent restart: the return value is meaningless.
			cancel()
			wg.Wait()
			n.setState(StateStopped, nil)
			return
		}
		if err == nil {
			// Done: children keep running in genCtx until the parent ends.
			n.setState(StateDone, nil)
			<-parentCtx.Done()
			cancel()
			wg.Wait()
			n.setState(StateStopped, nil)
			return
		}

		if errors.Is(err, ErrRestart) {
			// Asked for, not a failure: no backoff, no restart count.
			log.Info("restarting on request", "reason", err)
			cancel()
			wg.Wait()
			n.s.mu.Lock()
			n.children = map[string]*node{}
			n.s.mu.Unlock()
			continue
		}
		n.s.mu.Lock()
		if !n.healthy.IsZero() && n.state == StateHealthy && time.Since(n.healthy) > n.s.opts.ResetAfter {
			backoff = n.s.opts.InitialBackoff
			n.failures = 0
		}
		n.restarts++
		n.failures++
		n.lastErr = err
		n.s.mu.Unlock()
		log.Error("runnable failed, restarting", "err", err, "backoff", backoff)
		cancel()
		wg.Wait()
		n.s.mu.Lock()
		n.children = map[string]*node{}
		n.state = StateBackoff
		n.s.notifyLocked()
		n.s.mu.Unlock()

		select {
		case <-time.After(backoff):
		case <-parentCtx.Done():
			n.setState(StateStopped, nil)
			return
		}
		backoff = min(backoff*2, n.s.opts.MaxBackoff)
	}
}

func (n *node) call(ctx context.Context) (err error) {
	defer func() {
		if r := recover(); r != nil {
			err = fmt.Errorf("panic: %v\n%s", r, debug.Stack())
		}
	}()
	return n.runnable(ctx)
}

func (n *node) setState(st State, err error) {
	n.s.mu.Lock()
	n.state = st
	if err != nil {
		n.lastErr = err
	}
	n.s.notifyLocked()
	n.s.mu.Unlock()
}

func (s *Supervisor) notifyLocked() {
	close(s.changed)
	s.changed = make(chan struct{})
}

// Status of one runnable.
type Status struct {
	DN       string
	State    State
	Restarts int
	// Failures counts the failures in a row: it goes back to 0 once the
	// runnable stayed healthy for Options.ResetAfter.
	Failures int
	LastErr  string
	// PID is the process the runnable runs now (RunCommand's child; the
	// supervisor's own process for the root), 0 if none.
	PID int
}

// Snapshot returns the status of every runnable, sorted by DN.
func (s *Supervisor) Snapshot() []Status {
	s.mu.Lock()
	defer s.mu.Unlock()
	var out []Status
	var walk func(n *node)
	walk = func(n *node) {
		st := Status{DN: n.dn, State: n.state, Restarts: n.restarts, Failures: n.failures, PID: n.pid}
		if n.parent == nil {
			st.PID = os.Getpid()
		}
		if n.state == StateHealthy && !n.healthy.IsZero() && time.Since(n.healthy) > s.opts.ResetAfter {
			st.Failures = 0
		}
		if n.lastErr != nil {
			st.LastErr = n.lastErr.Error()
		}
		out = append(out, st)
		for _, c := range n.children {
			walk(c)
		}
	}
	walk(s.root)
	sort.Slice(out, func(i, j int) bool { return out[i].DN < out[j].DN })
	return out
}

// Healthy reports whether every runnable is healthy or done.
func (s *Supervisor) Healthy() bool {
	for _, st := range s.Snapshot() {
		if st.State != StateHealthy && st.State != StateDone {
			return false
		}
	}
	return true
}

// Changed returns a channel closed at the next state change anywhere.
func (s *Supervisor) Changed() <-chan struct{} {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.changed
}

// WaitHealthy blocks until the whole tree is healthy or ctx ends.
func (s *Supervisor) WaitHealthy(ctx context.Context) error {
	for {
		ch := s.Changed()
		if s.Healthy() {
			return nil
		}
		select {
		case <-ch:
		case <-ctx.Done():
			return ctx.Err()
		}
	}
}
