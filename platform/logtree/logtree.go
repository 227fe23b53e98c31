// Package logtree keeps the node's logs: a tree of named loggers (one per
// supervised runnable, named by its distinguished name "root.network.dhcp"),
// written to sinks such as the serial console in one stable line format and
// kept in an in-memory ring buffer that the node's API can serve later.
//
//	slog.Logger ──► handler(dn) ──► Tree ──┬──► ring buffer (last N entries) ──► Read / Subscribe
//	slog.Logger ──► handler(dn) ──┘        ├──► sinks (console: Entry.String() lines)
//	                                       └──► streams: a DN's own ring (Stream), not on
//	                                            the console, read by naming it
//
// A stream is for a voluminous log that must neither push everything
// else out of the shared ring nor flood the console: the API server's
// audit log (one entry per request) is one.
//
// The line format is:
//
//	2026-11-29T23:14:01.123456Z I root.network: got lease addr=10.0.2.15/24
//
// i.e. timestamp (UTC, microseconds), level letter (D I W E), the DN, a
// colon, the message, then attributes as key=value (values with spaces are
// quoted). ParseLine reverses it, so tests can read consoles reliably.
package logtree

import (
	"bytes"
	"context"

	"io"
	"log/slog"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"time"
)

// Entry is one log record.
type Entry struct {
	Time    time.Time
	Level   slog.Level
	DN      string
	Message string
	// Attrs are the record's attributes, already formatted as key=value.
	Attrs []string
}

const timeLayout = "2006-01-02T15:04:05.000000Z"

// String renders the entry in the console line format.
func (e Entry) String() string {
	var b strings.Builder
	b.WriteString(e.Time.UTC().Format(timeLayout))
	b.WriteByte(' ')
	b.WriteByte(levelLetter(e.Level))
	b.WriteByte(' ')
	b.WriteString(e.DN)
	b.WriteString(": ")
	// A message never spans lines on the console: a parser relies on one
	// entry per line.
	b.WriteString(strings.ReplaceAll(e.Message, "\n", `\n`))
	for _, a := range e.Attrs {
		b.WriteByte(' ')
		b.WriteString(a)
	}
	return b.String()
}

func levelLetter(l slog.Level) byte {
	switch {
	case l >= slog.LevelError:
		return 'E'
	case l >= slog.LevelWarn:
		return 'W'
	case l >= slog.LevelInfo:
		return 'I'
	default:
		return 'D'
	}
}

var lineRE = regexp.MustCompile(`^(\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{6}Z) ([DIWE]) ([^\s:]+): (.*)$`)

// ParseLine parses a console line written by Entry.String. Attributes stay
// part of Message: they cannot be told apart from message text reliably.
func ParseLine(line string) (Entry, bool) {
	m := lineRE.FindStringSubmatch(line)
	if m == nil {
		return Entry{}, false
	}
	t, err := time.Parse(timeLayout, m[1])
	if err != nil {
		return Entry{}, false
	}
	lvl := map[string]slog.Level{"D": slog.LevelDebug, "I": slog.LevelInfo, "W": slog.LevelWarn, "E": slog.LevelError}[m[2]]
	return Entry{Time: t, Level: lvl, DN: m[3], Message: m[4]}, true
}

// Tree is the log tree of one node.
type Tree struct {
	mu       sync.Mutex
	main     ring
	streams  map[string]*ring
	sinks    []*sink
	subs     map[*subscription]struct{}
	minLevel slog.Level
	now      func() time.Time
}

// ring keeps the last len(entries) entries.
type ring struct {
	entries []Entry
	next    int
	full    bool
}

func newRing(capacity int) ring { return ring{entries: make([]Entry, capacity)} }

func (r *ring) add(e Entry) {
	r.entries[r.next] = e
	r.next = (r.next + 1) % len(r.entries)
	if r.next == 0 {
		r.full = true
	}
}

// all is every entry kept, oldest first.
func (r *ring) all() []Entry {
	var out []Entry
	if r.full {
		out = append(out, r.entries[r.next:]...)
	}
	return append(out, r.entries[:r.next]...)
}

type subscription struct {
	prefix string
	ch     chan Entry
}

// New makes a tree keeping the last capacity entries in memory.
func New(capacity int) *Tree {
	if capacity <= 0 {
		capacity = 8192
	}
	return &Tree{main: newRing(capacity), streams: map[string]*ring{}, subs: map[*subscription]struct{}{}, minLevel: slog.LevelInfo, now: time.Now}
}

// Stream keeps the entries at or below dn in a ring of their own of
// capacity entries, apart from the others and off the sinks; Read and
// Subscribe see them only for a prefix at or below dn. Registering dn
// again keeps its ring.
func (t *Tree) Stream(dn string, capacity int) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if _, ok := t.streams[dn]; !ok && capacity > 0 {
		r := newRing(capacity)
		t.streams[dn] = &r
	}
}

// streamOf is the stream dn belongs to, or "" and nil; t.mu is held.
func (t *Tree) streamOf(dn string) (string, *ring) {
	for s, r := range t.streams {
		if underDN(dn, s) {
			return s, r
		}
	}
	return "", nil
}

// SetLevel sets the lowest level that is recorded (default Info).
func (t *Tree) SetLevel(l slog.Level) {
	t.mu.Lock()
	t.minLevel = l
	t.mu.Unlock()
}

func (t *Tree) enabled(l slog.Level) bool {
	t.mu.Lock()
	defer t.mu.Unlock()
	return l >= t.minLevel
}

// Log records one entry.
func (t *Tree) Log(e Entry) {
	if e.Time.IsZero() {
		e.Time = t.now()
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	stream, r := t.streamOf(e.DN)
	if r != nil {
		r.add(e)
	} else {
		t.main.add(e)
		line := []byte(e.String() + "\n")
		for _, s := range t.sinks {
			s.offer(e, line)
		}
	}
	for s := range t.subs {
		if !underDN(e.DN, s.prefix) || (r != nil && !underDN(s.prefix, stream)) {
			continue
		}
		select {
		case s.ch <- e:
		default: // a slow reader loses entries rather than blocking the node
		}
	}
}

func underDN(dn, prefix string) bool {
	return prefix == "" || dn == prefix || strings.HasPrefix(dn, prefix+".")
}

// Read returns the buffered entries at or below the DN prefix ("" for all
// but the streams'), oldest first, at most the last n (n <= 0: all).
func (t *Tree) Read(prefix string, n int) []Entry {
	t.mu.Lock()
	defer t.mu.Unlock()
	all := t.main.all()
	for s, r := range t.streams {
		if underDN(prefix, s) && prefix != "" {
			all = r.all()
		}
	}
	var out []Entry
	for _, e := range all {
		if underDN(e.DN, prefix) {
			out = append(out, e)
		}
	}
	if n > 0 && len(out) > n {
		out = out[len(out)-n:]
	}
	return out
}

// Subscribe streams new entries at or below prefix until ctx is done.
func (t *Tree) Subscribe(ctx context.Context, prefix string) <-chan Entry {
	s := &subscription{prefix: prefix, ch: make(chan Entry, 1024)}
	t.mu.Lock()
	t.subs[s] = struct{}{}
	t.mu.Unlock()
	go func() {
		<-ctx.Done()
		t.mu.Lock()
		delete(t.subs, s)
		close(s.ch)
		t.mu.Unlock()
	}()
	return s.ch
}

// Logger returns a structured logger writing under dn.
func (t *Tree) Logger(dn string) *slog.Logger {
	return slog.New(&handler{tree: t, dn: dn})
}

// Writer returns an io.Writer that logs each line written to it under dn at
// level: for libraries that only know the standard log package or stderr.
func (t *Tree) Writer(dn string, level slog.Level) io.Writer {
	return &lineWriter{tree: t, dn: dn, level: level}
}

type lineWriter struct {
	mu    sync.Mutex
	tree  *Tree
	dn    string
	level slog.Level
	buf   []byte
}

func (w *lineWriter) Write(p []byte) (int, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.buf = append(w.buf, p...)
	rest := w.buf
	for {
		i := bytes.IndexByte(rest, '\n')
		if i < 0 {
			break
		}
		line := string(bytes.TrimRight(rest[:i], "\r"))
		rest = rest[i+1:]
		if line != "" {
			w.tree.Log(Entry{Level: w.level, DN: w.dn, Message: line})
		}
	}
	// Keep only the unfinished line (copied down: the buffer does not
	// grow with everything ever written).
	w.buf = append(w.buf[:0], rest...)
	return len(p), nil
}

type handler struct {
	tree   *Tree
	dn     string
	attrs  []string
	groups string
}

func (h *handler) Enabled(_ context.Context, l slog.Level) bool { return h.tree.enabled(l) }

func (h *handler) Handle(_ context.Context, r slog.Record) error {
	attrs := append([]string(nil), h.attrs...)
	r.Attrs(func(a slog.Attr) bool {
		attrs = appendAttr(attrs, h.groups, a)
		return true
	})
	h.tree.Log(Entry{Time: r.Time, Level: r.Level, DN: h.dn, Message: r.Message, Attrs: attrs})
	return nil
}

func (h *handler) WithAttrs(as []slog.Attr) slog.Handler {
	n := *h
	n.attrs = append([]string(nil), h.attrs...)
	for _, a := range as {
		n.attrs = appendAttr(n.attrs, h.groups, a)
	}
	return &n
}

func (h *handler) WithGroup(name string) slog.Handler {
	n := *h
	n.groups = h.groups + name + "."
	return &n
}

func appendAttr(out []string, prefix string, a slog.Attr) []string {
	a.Value = a.Value.Resolve()
	if a.Equal(slog.Attr{}) {
		return out
	}
	if a.Value.Kind() == slog.KindGroup {
		for _, g := range a.Value.Group() {
			out = appendAttr(out, prefix+a.Key+".", g)
		}
		return out
	}
	return append(out, prefix+a.Key+"="+quoteValue(a.Value))
}

func quoteValue(v slog.Value) string {
	var s string
	switch v.Kind() {
	case slog.KindDuration:
		s = v.Duration().Round(time.Microsecond).String()
	case slog.KindTime:
		s = v.Time().UTC().Format(time.RFC3339Nano)
	default:
		s = v.String()
	}
	if s == "" || strings.ContainsAny(s, " \t\n\"=") {
		return strconv.Quote(s)
	}
	return s
}
