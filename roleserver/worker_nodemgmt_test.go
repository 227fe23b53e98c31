package roleserver

import (
	"context"
	"log/slog"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc"

	"plinth.dev/plinth/api/clusterpb"
	"plinth.dev/plinth/platform/logtree"
	"plinth.dev/plinth/roleserver/kubernetes"
	"plinth.dev/plinth/roleserver/kubernetes/auditlog"
)

func TestLogHelpers(t *testing.T) {
	for l, want := range map[slog.Level]string{slog.LevelDebug: "DEBUG", slog.LevelInfo: "INFO", slog.LevelWarn: "WARNING", slog.LevelError: "ERROR"} {
		if got := levelName(l); got != want {
			t.Errorf("levelName(%v) = %s, want %s", l, got, want)
		}
	}
	exact := logMatcher("root.a", false)
	if !exact(logtree.Entry{DN: "root.a"}) || exact(logtree.Entry{DN: "root.a.b"}) {
		t.Error("non-recursive matcher")
	}
	if root := logMatcher("", false); !root(logtree.Entry{DN: "root"}) || root(logtree.Entry{DN: "root.x"}) {
		t.Error("empty DN, non-recursive: want the root only")
	}
	es := logEntries([]logtree.Entry{{Time: time.Unix(0, 42), Level: slog.LevelWarn, DN: "root.a", Message: "m", Attrs: []string{"k=v"}}})
	if e := es[0]; e.GetTimeUnixNanos() != 42 || e.GetLevel() != "WARNING" || e.GetDn() != "root.a" || e.GetMessage() != "m" || strings.Join(e.GetAttributes(), ",") != "k=v" {
		t.Errorf("converted entry %v", e)
	}
}

// logsStream is a Logs call's server side that keeps what is sent.
type logsStream struct {
	grpc.ServerStream
	entries []*clusterpb.LogEntry
}

func (s *logsStream) Context() context.Context { return context.Background() }
func (s *logsStream) Send(r *clusterpb.LogsResponse) error {
	s.entries = append(s.entries, r.GetEntries()...)
	return nil
}

// TestLogsAuditFromStore: the audit log's backlog (kubernetes.AuditDN,
// as plinthctl node logs --audit asks, recursive or not) comes from the store
// on the data volume, oldest first, the last N if asked; the log tree's
// stream, which a reboot empties, is not read for it.
func TestLogsAuditFromStore(t *testing.T) {
	dir := t.TempDir()
	s, err := auditlog.Open(dir, nil)
	if err != nil {
		t.Fatal(err)
	}
	at := func(i int) string { return time.Unix(1_800_000_000+int64(i), 0).UTC().Format(time.RFC3339Nano) }
	s.Write([]byte(`{"verb":"create","objectRef":{"subresource":"exec"},"user":{"username":"plinth-owner:1"},"stageTimestamp":"` + at(1) + `"}` + "\n"))
	s.Write([]byte(`{"verb":"get","user":{"username":"tenant"},"stageTimestamp":"` + at(2) + `"}` + "\n"))
	s.Write([]byte(`{"verb":"get","user":{"username":"system:anonymous"},"stageTimestamp":"` + at(3) + `"}` + "\n"))
	s.Close()
	lt := logtree.New(100)
	lt.Logger(kubernetes.AuditDN).Info("only in the stream")
	m := &nodeManagement{w: &workerNodeMgmt{logTree: lt, auditDir: dir}, log: slog.New(slog.DiscardHandler)}
	for _, c := range []struct {
		recursive bool
		backlog   int64
		want      []string
	}{
		{true, -1, []string{"exec", "tenant", "anonymous"}},
		{false, -1, []string{"exec", "tenant", "anonymous"}},
		{true, 2, []string{"tenant", "anonymous"}},
	} {
		st := &logsStream{}
		if err := m.Logs(&clusterpb.LogsRequest{Dn: kubernetes.AuditDN, Recursive: c.recursive, Backlog: c.backlog}, st); err != nil {
			t.Fatal(err)
		}
		if len(st.entries) != len(c.want) {
			t.Fatalf("recursive %v, backlog %d: %d entries, want %d: %v", c.recursive, c.backlog, len(st.entries), len(c.want), st.entries)
		}
		for i, w := range c.want {
			if e := st.entries[i]; !strings.Contains(e.GetMessage(), w) || e.GetDn() != kubernetes.AuditDN {
				t.Errorf("recursive %v, backlog %d: entry %d is %v, want the %s event", c.recursive, c.backlog, i, e, w)
			}
		}
	}
}
