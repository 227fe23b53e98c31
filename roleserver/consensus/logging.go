package consensus

import (
	"context"
	"fmt"
	"log/slog"
	"sort"

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
func newZapLogger(sl *slog.Logger, stopping ...<-chan struct{}) *zap.Logger {
	return zap.New(&slogCore{sl: sl, stopping: stopping}, zap.WithFatalHook(zapcore.WriteThenPanic))
}

// slogCore is a zapcore.Core writing to an slog.Logger.
type slogCore struct {
	sl       *slog.Logger
	stopping []<-chan struct{}
	fields   []zapcore.Field
}

func (c *slogCore) level(l zapcore.Level) slog.Level {
	sl := zapToSlogLevel(l)
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
	return &slogCore{sl: c.sl, stopping: c.stopping, fields: all}
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
	c.sl.LogAttrs(context.Background(), c.level(e.Level), e.Message, attrs...)
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
