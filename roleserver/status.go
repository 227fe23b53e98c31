package roleserver

// The node's own status (as pushed to the curator and served by
// NodeManagement) and its addresses.

import (
	"context"
	"errors"
	"fmt"
	"net"
	"slices"
	"strconv"
	"strings"

	"google.golang.org/protobuf/proto"

	"plinth.dev/plinth/api/clusterpb"
	"plinth.dev/plinth/platform/supervisor"
)

// status is the node's own status, as pushed to the curator. runnables
// are the supervisor's (supervisor.Snapshot of the asking worker's
// context): those in a crash loop are problems of the node.
func (s *Service) status(runnables []supervisor.Status) *clusterpb.NodeStatus {
	st := &clusterpb.NodeStatus{Addresses: s.addresses(), Version: s.Version, BootCount: s.bootCount(), Problems: s.currentProblems(runnables)}
	if !s.BootTime.IsZero() {
		st.BootTimeUnixNanos = s.BootTime.UnixNano()
	}
	if s.Updates != nil {
		st.Software = software(s.Updates.Status())
	}
	return st
}

// bootCount is Config.BootCount or, when that is unset, the counter init
// keeps on the data volume (a registering node opens it only after the
// Role Server started).
func (s *Service) bootCount() int64 {
	if s.BootCount != 0 || s.StorageRoot == nil {
		return s.BootCount
	}
	b, err := s.StorageRoot.Data.Node.BootCount.Read()
	if err != nil {
		return 0
	}
	n, _ := strconv.ParseInt(strings.TrimSpace(string(b)), 10, 64)
	return n
}

// currentProblems are the ongoing problems, by component: those the
// workers set, those found at boot and the runnables in a crash loop.
func (s *Service) currentProblems(runnables []supervisor.Status) []*clusterpb.NodeProblem {
	out := s.problems.list()
	for _, p := range s.BootProblems {
		out = append(out, proto.CloneOf(p))
	}
	out = append(out, crashLoops(runnables)...)
	slices.SortFunc(out, func(a, b *clusterpb.NodeProblem) int { return strings.Compare(a.Component, b.Component) })
	return out
}

// crashLoopFailures is how many failures in a row make a runnable a
// problem of the node (a Kubernetes component that keeps crashing).
const crashLoopFailures = 3

// crashLoops are the runnables that failed crashLoopFailures times in a
// row without staying healthy in between.
func crashLoops(runnables []supervisor.Status) []*clusterpb.NodeProblem {
	var out []*clusterpb.NodeProblem
	for _, r := range runnables {
		if r.Failures < crashLoopFailures {
			continue
		}
		out = append(out, &clusterpb.NodeProblem{
			Component: r.DN,
			Message:   fmt.Sprintf("failed %d times in a row, last: %s", r.Failures, r.LastErr),
		})
	}
	return out
}

// addresses are the node's current addresses, most preferred first.
func (s *Service) addresses() []string {
	if s.knobs != nil && s.knobs.addresses != nil {
		return append([]string(nil), s.knobs.addresses...)
	}
	if s.Network == nil {
		return nil
	}
	st, ok := s.Network.Status()
	if !ok || !st.Address.IsValid() {
		return nil
	}
	return []string{st.Address.Addr().String()}
}

// waitAddresses blocks until the node has an address.
func (s *Service) waitAddresses(ctx context.Context) ([]string, error) {
	if a := s.addresses(); len(a) > 0 || s.Network == nil {
		return a, nil
	}
	supervisor.Logger(ctx).Info("waiting for a network address")
	if _, err := s.Network.WaitAddress(ctx); err != nil {
		return nil, err
	}
	return s.addresses(), nil
}

// waitAddress is the node's preferred address, once it has one.
func (s *Service) waitAddress(ctx context.Context) (net.IP, error) {
	a, err := s.waitAddresses(ctx)
	if err != nil {
		return nil, err
	}
	for _, x := range a {
		if ip := net.ParseIP(x); ip != nil {
			return ip, nil
		}
	}
	return nil, errors.New("roleserver: the node has no address")
}
