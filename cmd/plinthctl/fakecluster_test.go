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

// owned is ownerDir after a successful plinthctl cluster takeownership.
func (f *fakeCluster) owned(t *testing.T) string {
	t.Helper()
	dir := f.ownerDir(t)
	ctl(t, "cluster", "takeownership", "--config", dir, "--endpoint", f.Addr)
	return dir
}

// runCLI runs plinthctl with args as main does, capturing its output
// and exit code.
func runCLI(args ...string) (stdout, stderr string, code int) {
	var out, errb bytes.Buffer
	code = execute(context.Background(), args, &out, &errb)
	return out.String(), errb.String(), code
}

// ctl is runCLI for a command that must succeed.
func ctl(t *testing.T, args ...string) (stdout, stderr string) {
	t.Helper()
	stdout, stderr, code := runCLI(args...)
	if code != 0 {
		t.Fatalf("plinthctl %s: exit %d\n%s", strings.Join(args, " "), code, stderr)
	}
	return stdout, stderr
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
