package consensus

import (
	"errors"
	"log/slog"
	"testing"

	"github.com/coreos/go-semver/semver"
	"go.etcd.io/etcd/api/v3/version"
	serverversion "go.etcd.io/etcd/server/v3/etcdserver/version"

	"plinth.dev/plinth/platform/logtree"
)

// freshMember is what etcd's version monitor sees on a member whose backend
// has not yet committed a raft term: a cluster version, no storage version,
// and a migration that fails. It stands in for etcd's server below the
// monitor; the monitor and its logging are etcd's own.
type freshMember struct{ serverversion.Server }

func (freshMember) GetClusterVersion() *semver.Version { return semver.New("3.7.0") }
func (freshMember) GetStorageVersion() *semver.Version { return nil }
func (freshMember) UpdateStorageVersion(semver.Version) error {
	return errors.New("cannot detect storage schema version: missing term information")
}
func (freshMember) GetDowngradeInfo() *serverversion.DowngradeInfo   { return nil }
func (freshMember) GetMembersVersions() map[string]*version.Versions { return nil }

// TestRetriedEtcdFailureWarnsOnce runs etcd's storage-version monitor
// against a member that cannot migrate yet: its first failure (which etcd
// retries 4 s later) is a warning, a second is an error, an error from any
// other etcd code stays an error, and all of them are info once the node
// stops.
func TestRetriedEtcdFailureWarnsOnce(t *testing.T) {
	tree := logtree.New(100)
	stopping := make(chan struct{})
	lg := newZapLogger(tree.Logger("first"), stopping).Named("etcd")
	m := serverversion.NewMonitor(lg, freshMember{})

	m.UpdateStorageVersionIfNeeded()
	lg.Error("some other failure")
	m.UpdateStorageVersionIfNeeded()
	close(stopping)
	m.UpdateStorageVersionIfNeeded()

	want := []struct {
		level slog.Level
		msg   string
	}{
		{slog.LevelWarn, "failed to update storage version"},
		{slog.LevelError, "some other failure"},
		{slog.LevelError, "failed to update storage version"},
		{slog.LevelInfo, "failed to update storage version"},
	}
	got := tree.Read("first", 0)
	if len(got) != len(want) {
		for _, e := range got {
			t.Log(e)
		}
		t.Fatalf("%d records, want %d", len(got), len(want))
	}
	for i, w := range want {
		if got[i].Level != w.level || got[i].Message != w.msg {
			t.Errorf("record %d: %v %q, want %v %q", i, got[i].Level, got[i].Message, w.level, w.msg)
		}
	}

	// A second etcd instance (the real member after the bootstrap's
	// temporary one) has its own first failure.
	serverversion.NewMonitor(newZapLogger(tree.Logger("second")), freshMember{}).UpdateStorageVersionIfNeeded()
	if r := tree.Read("second", 0); len(r) != 1 || r[0].Level != slog.LevelWarn {
		t.Errorf("a new instance's first failure: %v, want one warning", r)
	}
}
