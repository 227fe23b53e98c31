package roleserver

// Shared state of the workers: each type owns its data and its lock, and
// the workers that touch it get it as a named input.

import (
	"context"
	"fmt"
	"log/slog"
	"net"
	"slices"
	"sync"
	"time"

	"google.golang.org/protobuf/proto"

	"plinth.dev/plinth/api/clusterpb"
	"plinth.dev/plinth/platform/supervisor"
	"plinth.dev/plinth/roleserver/localstorage"
	"plinth.dev/plinth/roleserver/rpc"
)

// problems are the node's ongoing problems by component, for its status.
// The zero value is ready to use.
type problems struct {
	mu sync.Mutex
	m  map[string]*clusterpb.NodeProblem
}

// set records an ongoing problem of component (its start time is kept
// while it lasts).
func (p *problems) set(component, msg string) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.m == nil {
		p.m = map[string]*clusterpb.NodeProblem{}
	}
	since := time.Now().UnixNano()
	if old := p.m[component]; old != nil {
		since = old.SinceUnixNanos
	}
	p.m[component] = &clusterpb.NodeProblem{Component: component, Message: msg, SinceUnixNanos: since}
}

// clear ends component's problem; it reports whether there was one.
func (p *problems) clear(component string) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	_, had := p.m[component]
	delete(p.m, component)
	return had
}

// list returns copies of the ongoing problems, in no particular order.
func (p *problems) list() []*clusterpb.NodeProblem {
	p.mu.Lock()
	defer p.mu.Unlock()
	out := make([]*clusterpb.NodeProblem, 0, len(p.m))
	for _, np := range p.m {
		out = append(out, proto.Clone(np).(*clusterpb.NodeProblem))
	}
	return out
}

// curatorEndpoints are where the resolver looks for the curator leader.
type curatorEndpoints struct {
	local     string   // this node's own curator while it runs
	directory []string // the consensus members, as the cluster last said
	fallback  []string // the node parameters' curator endpoints
	// former are the addresses of decommissioned nodes: never an
	// endpoint, whichever list names them.
	former map[string]bool
}

// list is the resolver's endpoint list: local, directory, fallback, in
// that order, without duplicates and without former nodes' addresses.
func (e *curatorEndpoints) list() []string {
	var out []string
	for _, group := range [][]string{{e.local}, e.directory, e.fallback} {
		for _, ep := range group {
			host, _, err := net.SplitHostPort(ep)
			if ep == "" || slices.Contains(out, ep) || (err == nil && e.former[host]) {
				continue
			}
			out = append(out, ep)
		}
	}
	return out
}

// resolverEndpoints are the curator endpoint groups, changed by the
// curator connection (workerCurator: the registration directory, the
// parameters' and the local curator) and by the hosts worker (the
// cluster's consensus members, former nodes). The zero value is ready to
// use.
type resolverEndpoints struct {
	mu sync.Mutex
	e  curatorEndpoints
}

// update changes the endpoint groups and hands the result to res.
func (r *resolverEndpoints) update(res *rpc.Resolver, change func(*curatorEndpoints)) {
	r.mu.Lock()
	change(&r.e)
	eps := r.e.list()
	r.mu.Unlock()
	res.SetEndpoints(eps)
}

// rolesRetry is how often a failed write of the roles file is retried.
const rolesRetry = 5 * time.Second

// rolesFile is /data/node/roles: it writes the node's roles, and keeps
// roles whose write failed, retrying until it works and showing the
// failure in the node's problems meanwhile.
type rolesFile struct {
	root *localstorage.Root
	// problems get the "roles" problem while a write fails.
	problems *problems
	// beforeWrite, if set, runs before every write; an error fails the
	// write (knobs.saveRoles).
	beforeWrite func(*clusterpb.NodeRoles) error
	// retryEvery is how often retry tries again (rolesRetry unless a
	// test says otherwise).
	retryEvery time.Duration

	mu      sync.Mutex
	unsaved *clusterpb.NodeRoles // roles whose write failed, for retry
}

// save persists roles to /data/node/roles.
func (f *rolesFile) save(roles *clusterpb.NodeRoles) error {
	if f.beforeWrite != nil {
		if err := f.beforeWrite(roles); err != nil {
			return err
		}
	}
	b, err := proto.Marshal(roles)
	if err != nil {
		return err
	}
	if err := localstorage.Create(&f.root.Data.Node, 0o700); err != nil {
		return err
	}
	return f.root.Data.Node.Roles.Write(b, 0o600)
}

// persist writes roles to /data/node/roles; on failure it keeps them for
// retry and reports the problem in the node status.
func (f *rolesFile) persist(log *slog.Logger, roles *clusterpb.NodeRoles) {
	err := f.save(roles)
	f.mu.Lock()
	if err != nil {
		f.unsaved = roles
	} else {
		f.unsaved = nil
	}
	f.mu.Unlock()
	if err != nil {
		log.Error("saving roles failed; retrying", "file", f.root.Data.Node.Roles.Path(), "err", err)
		f.problems.set("roles", fmt.Sprintf("saving roles to %s failed (retrying every %v): %v", f.root.Data.Node.Roles.Path(), rolesRetry, err))
		return
	}
	if f.problems.clear("roles") {
		log.Info("roles saved", "file", f.root.Data.Node.Roles.Path())
	}
}

// retry retries a failed write of the roles file until ctx ends.
func (f *rolesFile) retry(ctx context.Context) {
	every := rolesRetry
	if f.retryEvery != 0 {
		every = f.retryEvery
	}
	for supervisor.Sleep(ctx, every) == nil {
		f.mu.Lock()
		roles := f.unsaved
		f.mu.Unlock()
		if roles != nil {
			f.persist(supervisor.Logger(ctx), roles)
		}
	}
}
