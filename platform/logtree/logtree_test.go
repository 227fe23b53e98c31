package logtree

import (
	"bytes"
	"context"
	"errors"
	"log"
	"log/slog"
	"strings"
	"testing"
	"time"
)

func TestLineFormatRoundTrip(t *testing.T) {
	e := Entry{
		Time:    time.Date(2026, 11, 29, 23, 14, 1, 123456789, time.UTC),
		Level:   slog.LevelWarn,
		DN:      "root.network.dhcp",
		Message: "lease renewed\nagain",
		Attrs:   []string{"addr=10.0.2.15/24"},
	}
	want := `2026-11-29T23:14:01.123456Z W root.network.dhcp: lease renewed\nagain addr=10.0.2.15/24`
	if got := e.String(); got != want {
		t.Fatalf("line format changed:\n got %s\nwant %s", got, want)
	}
	p, ok := ParseLine(want)
	if !ok || p.DN != e.DN || p.Level != slog.LevelWarn || !p.Time.Equal(e.Time.Truncate(time.Microsecond)) {
		t.Fatalf("ParseLine = %+v, %v", p, ok)
	}
	for _, bad := range []string{"", "[    1.234] kernel message", "2026-11-29T23:14:01Z I x: y"} {
		if _, ok := ParseLine(bad); ok {
			t.Errorf("ParseLine accepted %q", bad)
		}
	}
}

func TestSlogAttributesAndSink(t *testing.T) {
	lt := New(10)
	var console bytes.Buffer
	lt.AddSink(&console, nil)
	l := lt.Logger("root.storage").With("disk", "vda")
	l.Info("mounted", "size", 1024, "err", errors.New("a b"), slog.Group("g", "k", "v"))
	l.Debug("hidden")
	lt.Flush(time.Second)
	line := strings.TrimSpace(console.String())
	for _, want := range []string{" I root.storage: mounted", "disk=vda", "size=1024", `err="a b"`, "g.k=v"} {
		if !strings.Contains(line, want) {
			t.Errorf("console line %q lacks %q", line, want)
		}
	}
	if strings.Contains(console.String(), "hidden") {
		t.Error("debug entry written at default level")
	}
}

func TestRingBufferAndFilters(t *testing.T) {
	lt := New(3)
	for i, dn := range []string{"root.a", "root.ab", "root.a.x", "root.b", "root.a"} {
		lt.Log(Entry{DN: dn, Level: slog.LevelInfo, Message: string(rune('0' + i))})
	}
	var got []string
	for _, e := range lt.Read("", 0) {
		got = append(got, e.Message)
	}
	if strings.Join(got, "") != "234" {
		t.Fatalf("ring keeps %v, want last three 2 3 4", got)
	}
	if es := lt.Read("root.a", 0); len(es) != 2 || es[0].DN != "root.a.x" {
		t.Fatalf("prefix filter must match the DN and its children only, got %v", es)
	}
	if es := lt.Read("", 1); len(es) != 1 || es[0].Message != "4" {
		t.Fatalf("backlog limit: %v", es)
	}
}

func TestSubscribeAndWriter(t *testing.T) {
	lt := New(10)
	ctx, cancel := context.WithCancel(context.Background())
	ch := lt.Subscribe(ctx, "root.etcd")
	std := log.New(lt.Writer("root.etcd", slog.LevelWarn), "", 0)
	std.Print("raft: slow fsync")
	lt.Log(Entry{DN: "root.other", Message: "not for us"})
	e := <-ch
	if e.Message != "raft: slow fsync" || e.Level != slog.LevelWarn {
		t.Fatalf("got %+v", e)
	}
	cancel()
	for e := range ch {
		t.Fatalf("unexpected entry %v", e)
	}
}

// blockingWriter blocks every write until release is closed.
type blockingWriter struct{ release chan struct{} }

func (w blockingWriter) Write(p []byte) (int, error) { <-w.release; return len(p), nil }

// TestSlowSinkNeverBlocks: a sink that does not keep up (a serial console
// under emulation) loses lines instead of blocking the loggers, says how
// many it lost, and a sink's filter keeps child processes' chatter away.
func TestSlowSinkNeverBlocks(t *testing.T) {
	lt := New(100)
	w := blockingWriter{release: make(chan struct{})}
	lt.AddSink(w, nil)
	var console bytes.Buffer
	lt.AddSink(&console, NotProcessOutput)
	done := make(chan struct{})
	go func() {
		defer close(done)
		for i := 0; i < 3*sinkQueue; i++ {
			lt.Logger("root.x").Info("line")
		}
	}()
	select {
	case <-done:
	case <-time.After(20 * time.Second):
		t.Fatal("logging blocked on a slow sink")
	}
	close(w.release)
	lt.Logger("root.kubelet" + ProcessOutputSuffix).Info("chatter")
	lt.Logger("root.kubelet" + ProcessOutputSuffix).Error("failure")
	lt.Logger("root.x").Info("after")
	lt.Flush(5 * time.Second)
	out := console.String()
	if strings.Contains(out, "chatter") || !strings.Contains(out, "failure") || !strings.Contains(out, "after") {
		t.Errorf("filtered console:\n%s", out[max(0, len(out)-500):])
	}
}

// TestStream: a stream's entries stay in their own ring, off the
// console: many of them push nothing else out, and it is read (and
// subscribed to) only by naming it.
func TestStream(t *testing.T) {
	lt := New(4)
	lt.Stream("root.api.audit", 3)
	var console bytes.Buffer
	lt.AddSink(&console, nil)
	lt.Logger("root.api").Info("serving")
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	all, audit := lt.Subscribe(ctx, ""), lt.Subscribe(ctx, "root.api.audit")
	for i := range 10 {
		lt.Logger("root.api.audit").Info("event", "n", i)
	}
	lt.Logger("root.api").Info("still here")
	if got := lt.Read("", 0); len(got) != 2 || got[0].Message != "serving" || got[1].Message != "still here" {
		t.Errorf("Read(\"\") = %v, want the two entries outside the stream", got)
	}
	if got := lt.Read("root.api", 0); len(got) != 2 {
		t.Errorf("Read(root.api) = %v: the stream below it is read only by its name", got)
	}
	got := lt.Read("root.api.audit", 0)
	if len(got) != 3 || got[0].Attrs[0] != "n=7" || got[2].Attrs[0] != "n=9" {
		t.Errorf("Read(stream) = %v, want its last 3 entries", got)
	}
	lt.Stream("root.api.audit", 100) // again: the same ring
	if got := lt.Read("root.api.audit", 0); len(got) != 3 {
		t.Errorf("registering the stream again lost its entries: %v", got)
	}
	lt.Flush(time.Second)
	if strings.Contains(console.String(), "event") {
		t.Errorf("stream entries reached the console:\n%s", console.String())
	}
	if e := <-all; e.Message != "still here" {
		t.Errorf("a subscription to everything got %v first, not the entry outside the stream", e)
	}
	if e := <-audit; e.Message != "event" {
		t.Errorf("a subscription to the stream got %v", e)
	}
}
