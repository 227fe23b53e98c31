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

// ownedWithNode is owned with the fake node's NodeManagement address in
// the endpoints file, for the commands that talk to the node itself.
func (f *fakeCluster) ownedWithNode(t *testing.T) string {
	t.Helper()
	dir := f.owned(t)
	cfg, err := owner.LoadConfig(dir)
	if err != nil {
		t.Fatal(err)
	}
	cfg.NodeEndpoints = map[string]string{f.Node.ID(): f.NodeAddr}
	if err := cfg.Save(); err != nil {
		t.Fatal(err)
	}
	return dir
}

// exitCase is a command line and what plinthctl must answer it: the exit
// code and a piece of standard error.
type exitCase struct {
	args []string
	code int
	want string
}

// checkExits runs each case through the whole tree.
func checkExits(t *testing.T, cases []exitCase) {
	t.Helper()
	for _, tc := range cases {
		_, stderr, code := runCLI(tc.args...)
		if code != tc.code || !strings.Contains(stderr, tc.want) {
			t.Errorf("%v: exit %d, %s\nwant exit %d, %q", tc.args, code, stderr, tc.code, tc.want)
		}
	}
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
