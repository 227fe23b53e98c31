package main

import (
	"bytes"
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"plinth.dev/plinth/internal/testutil/fakecluster"
	"plinth.dev/plinth/roleserver/owner"
)

// fakeCluster is the shared fake cluster (AAA, Management,
// NodeManagement, a Kubernetes API server) with what plinthctl's tests
// add: an owner configuration directory before and after takeownership.
type fakeCluster struct {
	*fakecluster.Cluster
}

func newFakeCluster(t *testing.T) *fakeCluster {
	t.Helper()
	return &fakeCluster{fakecluster.New(t, fakecluster.Config{})}
}

// ownerDir is a configuration directory holding only the owner key, as
// plinthctl params -bootstrap or run leave it before takeownership.
func (f *fakeCluster) ownerDir(t *testing.T) string {
	t.Helper()
	dir := filepath.Join(t.TempDir(), "owner")
	if err := (&owner.Config{Dir: dir, Key: f.OwnerKey}).Save(); err != nil {
		t.Fatal(err)
	}
	return dir
}

// owned is ownerDir after a successful plinthctl takeownership.
func (f *fakeCluster) owned(t *testing.T) string {
	t.Helper()
	dir := f.ownerDir(t)
	if _, stderr, err := runVerb("takeownership", "-config", dir, "-endpoint", f.Addr); err != nil {
		t.Fatalf("takeownership: %v\n%s", err, stderr)
	}
	return dir
}

// runVerb runs a plinthctl verb as main does, capturing its output.
func runVerb(name string, args ...string) (stdout, stderr string, err error) {
	var out, errb bytes.Buffer
	err = commands[name].new().run(context.Background(), args, &out, &errb)
	return out.String(), errb.String(), err
}

// files lists the names in dir.
func files(t *testing.T, dir string) string {
	t.Helper()
	ents, err := os.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, e := range ents {
		names = append(names, e.Name())
	}
	return strings.Join(names, " ")
}
