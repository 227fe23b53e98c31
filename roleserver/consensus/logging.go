package consensus

import (
	"context"
	"fmt"
	"log/slog"
	"reflect"
	"runtime"
	"sort"
	"sync"

	serverversion "go.etcd.io/etcd/server/v3/etcdserver/version"
	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"
)

// newZapLogger returns a zap logger whose entries go into sl, so that etcd
// (which only speaks zap) logs into the node's log tree like everything
// else instead of to stderr, which on a node is the serial console.
//
// Fatal entries panic instead of calling os.Exit: in this process etcd runs
// inside PID 1, and a corrupted data directory must become an error of the
// consensus runnable, not a reboot loop of the whole node.
//
// Once stopping is done (the runnable's context ended), etcd's complaints
// about its own listeners closing are the expected sound of a shutdown,
// not faults: they are logged at info level so that a clean power-off
// shows no errors.
//
// The first failure of a step that etcd itself retries on a timer (see
// retriedByEtcd) is a warning; a second one from the same etcd instance is
// an error. Each etcd instance gets its own logger, so its own count.
func newZapLogger(sl *slog.Logger, stopping ...<-chan struct{}) *zap.Logger {
	core := &slogCore{sl: sl, stopping: stopping, failed: new(sync.Map)}
	// The caller tells which etcd function logged an entry: AddCaller.
	return zap.New(core, zap.WithFatalHook(zapcore.WriteThenPanic), zap.AddCaller())
}

// retriedByEtcd names the etcd functions whose error entries report a
// failure that etcd tries again by itself a few seconds later.
//
// UpdateStorageVersionIfNeeded runs when the cluster version changes and
// every 4 s. On a member that has just started, the cluster version can be
// set before the backend's first commit has stored a raft term, and then
// the storage schema cannot be detected yet ("missing term information").
// The next run, once the backend has committed, succeeds. This happened in
// the bootstrap's temporary member, whose single-node cluster sets its
// version within milliseconds of its first election.
//
// The names come from the functions themselves, so a rename in etcd breaks
// the build instead of this rule.
var retriedByEtcd = map[string]bool{
	funcName((*serverversion.Monitor).UpdateStorageVersionIfNeeded): true,
}

func funcName(f any) string {
	return runtime.FuncForPC(reflect.ValueOf(f).Pointer()).Name()
}

// firstFailure reports whether fn fails for the first time in this etcd
// instance (failed holds the functions that have).
func (c *slogCore) firstFailure(fn string) bool {
	_, seen := c.failed.LoadOrStore(fn, true)
	return !seen
}

// slogCore is a zapcore.Core writing to an slog.Logger.
type slogCore struct {
	sl       *slog.Logger
	stopping []<-chan struct{}
	failed   *sync.Map // retried functions that have failed once
	fields   []zapcore.Field
}

func (c *slogCore) level(e zapcore.Entry) slog.Level {
	sl := zapToSlogLevel(e.Level)
	if sl == slog.LevelError && e.Caller.Defined && retriedByEtcd[e.Caller.Function] && c.firstFailure(e.Caller.Function) {
		sl = slog.LevelWarn
	}
	if sl > slog.LevelInfo {
		for _, ch := range c.stopping {
			select {
			case <-ch:
				return slog.LevelInfo
			default:
			}
		}
	}
	return sl
}

func zapToSlogLevel(l zapcore.Level) slog.Level {
	switch {
	case l <= zapcore.DebugLevel:
		return slog.LevelDebug
	case l == zapcore.InfoLevel:
		return slog.LevelInfo
	case l == zapcore.WarnLevel:
		return slog.LevelWarn
	default:
		return slog.LevelError
	}
}

func (c *slogCore) Enabled(l zapcore.Level) bool {
	return c.sl.Enabled(context.Background(), zapToSlogLevel(l))
}

func (c *slogCore) With(fields []zapcore.Field) zapcore.Core {
	all := make([]zapcore.Field, 0, len(c.fields)+len(fields))
	all = append(append(all, c.fields...), fields...)
	return &slogCore{sl: c.sl, stopping: c.stopping, failed: c.failed, fields: all}
}

func (c *slogCore) Check(e zapcore.Entry, ce *zapcore.CheckedEntry) *zapcore.CheckedEntry {
	if c.Enabled(e.Level) {
		return ce.AddCore(e, c)
	}
	return ce
}

func (c *slogCore) Write(e zapcore.Entry, fields []zapcore.Field) error {
	enc := zapcore.NewMapObjectEncoder()
	for _, f := range c.fields {
		f.AddTo(enc)
	}
	for _, f := range fields {
		f.AddTo(enc)
	}
	keys := make([]string, 0, len(enc.Fields))
	for k := range enc.Fields {
		keys = append(keys, k)
	}
	// Map iteration order is random; sorted keys keep log lines diffable.
	sort.Strings(keys)
	attrs := make([]slog.Attr, 0, len(keys)+1)
	if e.LoggerName != "" {
		attrs = append(attrs, slog.String("logger", e.LoggerName))
	}
	for _, k := range keys {
		attrs = append(attrs, slog.Any(k, flatten(enc.Fields[k])))
	}
	c.sl.LogAttrs(context.Background(), c.level(e), e.Message, attrs...)
	return nil
}

// flatten turns the nested values of zap's map encoder into something the
// log tree prints on one line.
func flatten(v any) any {
	switch v := v.(type) {
	case string, bool, int, int64, uint64, float64:
		return v
	case fmt.Stringer:
		return v.String()
	case error:
		return v.Error()
	default:
		return fmt.Sprint(v)
	}
}

func (c *slogCore) Sync() error { return nil }
