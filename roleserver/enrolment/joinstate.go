package enrolment

// After enrolment: the sealed join state of a registered node, kept in
// step with the Role Server's word (ClusterKey) and the cluster's
// curators (Directory), and sealed again for an A/B update (Reseal).

import (
	"context"
	"slices"
	"strings"

	"google.golang.org/protobuf/proto"

	"plinth.dev/plinth/api/clusterpb"
	"plinth.dev/plinth/platform/event"
	"plinth.dev/plinth/platform/storage"
	"plinth.dev/plinth/platform/supervisor"
	"plinth.dev/plinth/roleserver"
)

// remember keeps the join state and cluster unlock key of a registered
// node for keepClusterKeyLocally.
func (s *Service) remember(js *joinState, cuk []byte) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.joined, s.clusterKey = js, cuk
}

// followClusterKey answers the Role Server's requests to keep the cluster
// unlock key sealed locally or to drop it (keepClusterKeyLocally). The
// Role Server waits for the answer to a keep before it starts etcd; nobody
// waits for a drop, so its failure is logged here (the next drop, on the
// curator's next word, tries again).
func (s *Service) followClusterKey(ctx context.Context) error {
	w := s.rs.ClusterKey.Watch()
	defer w.Close()
	supervisor.Signal(ctx, supervisor.SignalHealthy)
	for {
		r, err := w.Get(ctx, roleserver.NonNilClusterKey)
		if err != nil {
			return err
		}
		err = s.keepClusterKeyLocally(r.Keep)
		if err != nil && !r.Keep {
			supervisor.Logger(ctx).Error("removing the locally sealed cluster unlock key", "err", err)
		}
		r.Done(err)
	}
}

var nonNilDirectory = event.Filter(func(d *clusterpb.ClusterDirectory) bool { return d != nil })

// followDirectory seals every new curator directory the Role Server
// publishes into the join state (updateDirectory). A failure is logged;
// the next directory the Role Server publishes tries again.
func (s *Service) followDirectory(ctx context.Context) error {
	w := s.rs.Directory.Watch()
	defer w.Close()
	supervisor.Signal(ctx, supervisor.SignalHealthy)
	for {
		dir, err := w.Get(ctx, nonNilDirectory)
		if err != nil {
			return err
		}
		if err := s.updateDirectory(dir); err != nil {
			supervisor.Logger(ctx).Warn("saving the cluster directory", "err", err)
		}
	}
}

// updateDirectory replaces the curator directory in the sealed join state
// (a no-op unless this node registered, or when it is the sealed one), so
// that after a reboot it looks for the cluster where the curators are now,
// not where they were when it registered.
func (s *Service) updateDirectory(dir *clusterpb.ClusterDirectory) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.joined == nil || proto.Equal(sortedDirectory(s.joined.Directory), sortedDirectory(dir)) {
		return nil
	}
	next := *s.joined
	next.Directory = dir
	if err := s.reseal(&next); err != nil {
		return err
	}
	if s.Disk.Log != nil {
		s.Disk.Log.Info("cluster directory saved for the next boot", "curators", len(dir.GetNodes()))
	}
	return nil
}

func sortedDirectory(d *clusterpb.ClusterDirectory) *clusterpb.ClusterDirectory {
	if d == nil {
		return &clusterpb.ClusterDirectory{}
	}
	out := proto.Clone(d).(*clusterpb.ClusterDirectory)
	slices.SortFunc(out.Nodes, func(a, b *clusterpb.DirectoryNode) int { return strings.Compare(a.Id, b.Id) })
	return out
}

// reseal writes js as the header's join state and remembers it.
func (s *Service) reseal(js *joinState) error {
	blob, err := js.seal(s.Keys)
	if err != nil {
		return err
	}
	if err := storage.UpdateEnrolment(s.Disk.Disk, blob); err != nil {
		return err
	}
	s.joined = js
	return nil
}

// Reseal seals the join state in the data disk header again with Keys,
// which an A/B update changes to seal to the new slot's PCRs as well (and,
// once it is confirmed, to them alone). A no-op on a node that did not
// register (its header holds no join state).
func (s *Service) Reseal() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.joined == nil {
		return nil
	}
	return s.reseal(s.joined)
}

// keepClusterKeyLocally adds the cluster unlock key to the sealed join
// state in the data disk header (keep) or removes it (!keep). A consensus
// member keeps it so that its volume opens without a curator: otherwise
// a cluster whose members all went down could never come back, each
// member waiting for a curator that needs the others. Still sealed in the
// TPM to this node's measured boot, so a stolen disk gains nothing. A
// no-op on the node that bootstrapped the cluster, whose volume key never
// involved the cluster.
func (s *Service) keepClusterKeyLocally(keep bool) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.joined == nil || s.clusterKey == nil {
		return nil
	}
	if keep == (s.joined.ClusterUnlockKey != nil) {
		return nil
	}
	next := *s.joined
	next.ClusterUnlockKey = nil
	if keep {
		next.ClusterUnlockKey = s.clusterKey
	}
	if err := s.reseal(&next); err != nil {
		return err
	}
	if s.Disk.Log != nil {
		if keep {
			s.Disk.Log.Info("consensus member: cluster unlock key now sealed locally, so this node can start without the cluster")
		} else {
			s.Disk.Log.Info("no longer a consensus member: locally sealed cluster unlock key removed")
		}
	}
	return nil
}
