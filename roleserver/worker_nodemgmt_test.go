package roleserver

import (
	"log/slog"
	"strings"
	"testing"
	"time"

	"plinth.dev/plinth/platform/logtree"
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
