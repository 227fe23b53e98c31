package auditlog

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

func line(user string, groups []string, verb, group, sub string, at time.Time) string {
	g := `[]`
	if groups != nil {
		g = `["` + strings.Join(groups, `","`) + `"]`
	}
	return fmt.Sprintf(`{"kind":"Event","verb":%q,"user":{"username":%q,"groups":%s},"objectRef":{"apiGroup":%q,"subresource":%q},"stageTimestamp":%q}`+"\n",
		verb, user, g, group, sub, at.UTC().Format(time.RFC3339Nano))
}

// TestClassify: exec, attach and port-forward, RBAC changes and the
// owner's changes are interactive; nodes and the control plane are
// system; other changes, reads and unauthenticated requests each a
// class of their own.
func TestClassify(t *testing.T) {
	now := time.Now()
	for _, c := range []struct {
		line string
		want Class
	}{
		{line("plinth-owner:1", []string{"plinth:owner:0"}, "create", "", "exec", now), ClassInteractive},
		{line("alice", nil, "get", "", "portforward", now), ClassInteractive},
		{line("alice", nil, "create", "", "attach", now), ClassInteractive},
		{line("alice", nil, "patch", "rbac.authorization.k8s.io", "", now), ClassInteractive},
		{line("plinth-owner:1", nil, "delete", "apps", "", now), ClassInteractive},
		{line("plinth-owner:1", nil, "list", "", "", now), ClassReads},
		{line("alice", nil, "create", "", "", now), ClassChanges},
		{line("system:serviceaccount:tenant:default", nil, "update", "", "", now), ClassChanges},
		{line("alice", nil, "list", "", "", now), ClassReads},
		{line("alice", nil, "get", "rbac.authorization.k8s.io", "", now), ClassReads},
		{line("system:node:plinth-1", []string{"system:nodes"}, "patch", "", "status", now), ClassSystem},
		{line("system:kube-controller-manager", nil, "update", "", "", now), ClassSystem},
		{line("plinth-controller:plinth-1", []string{"system:masters"}, "patch", "rbac.authorization.k8s.io", "", now), ClassInteractive},
		{line("system:anonymous", []string{"system:unauthenticated"}, "get", "", "", now), ClassAnonymous},
		{line("mallory", []string{"system:unauthenticated"}, "create", "", "exec", now), ClassAnonymous},
		{"not json\n", ClassSystem},
		// Impersonated: whose request it is.
		{`{"verb":"get","user":{"username":"plinth-controller:x","groups":["system:masters"]},"impersonatedUser":{"username":"tenant"}}` + "\n", ClassReads},
	} {
		if got := Classify([]byte(c.line)); got != c.want {
			t.Errorf("%s: %s, want %s", strings.TrimSpace(c.line), got, c.want)
		}
	}
}

// TestStoreBudgets attacks the store as a tenant and an anonymous caller
// would: one exec, then 5000 reads and 5000 unauthenticated requests,
// written in pieces that split lines as a pipe does. The exec is still
// there when the store is opened again (a reboot); the reads and the
// anonymous requests kept no more than their budgets; Read returns
// everything oldest first.
func TestStoreBudgets(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "audit")
	budgets := map[Class]int64{ClassInteractive: 64 << 10, ClassChanges: 64 << 10, ClassSystem: 64 << 10, ClassReads: 64 << 10, ClassAnonymous: 32 << 10}
	s, err := Open(dir, budgets)
	if err != nil {
		t.Fatal(err)
	}
	t0 := time.Now()
	exec := line("plinth-owner:7", nil, "create", "", "exec", t0)
	var all strings.Builder
	all.WriteString(exec)
	for i := range 5000 {
		all.WriteString(line("tenant", nil, "get", "", "", t0.Add(time.Duration(i+1)*time.Millisecond)))
		all.WriteString(line("system:anonymous", []string{"system:unauthenticated"}, "get", "", "", t0.Add(time.Duration(i+1)*time.Millisecond)))
	}
	b := []byte(all.String())
	for len(b) > 0 {
		n := min(len(b), 777)
		if _, err := s.Write(b[:n]); err != nil {
			t.Fatal(err)
		}
		b = b[n:]
	}
	if err := s.Close(); err != nil || s.Failed() != 0 {
		t.Fatalf("close: %v, %d events failed", err, s.Failed())
	}
	for c, budget := range budgets {
		var kept int64
		for _, p := range []string{string(c) + ".log", string(c) + ".log.1"} {
			if st, err := os.Stat(filepath.Join(dir, p)); err == nil {
				kept += st.Size()
			}
		}
		if kept > budget {
			t.Errorf("%s keeps %d bytes, its budget is %d", c, kept, budget)
		}
	}
	// Opened again, as after a reboot: one more event appends.
	s, err = Open(dir, budgets)
	if err != nil {
		t.Fatal(err)
	}
	s.Write([]byte(line("alice", nil, "create", "", "", t0.Add(time.Hour))))
	s.Close()
	events, err := Read(dir)
	if err != nil {
		t.Fatal(err)
	}
	if len(events) < 3 || events[0].Line != strings.TrimSpace(exec) || events[0].Class != ClassInteractive || events[len(events)-1].Class != ClassChanges {
		t.Fatalf("read %d events; first %+v, last %+v", len(events), events[0], events[len(events)-1])
	}
	for i := 1; i < len(events); i++ {
		if events[i].Time.Before(events[i-1].Time) {
			t.Fatalf("events out of order at %d", i)
		}
	}
}
