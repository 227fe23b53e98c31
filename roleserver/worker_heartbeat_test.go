package roleserver

import (
	"context"
	"errors"
	"log/slog"
	"sync/atomic"
	"testing"
	"time"

	"google.golang.org/grpc"

	"plinth.dev/plinth/api/clusterpb"
	"plinth.dev/plinth/roleserver/internal/testutil"
	"plinth.dev/plinth/roleserver/rpc"
)

// silentCurator receives heartbeats and never answers, like a curator
// whose connection still looks fine but that is gone or stuck.
type silentCurator struct {
	clusterpb.UnimplementedCuratorServer
	received atomic.Int32
}

func (c *silentCurator) Heartbeat(srv grpc.BidiStreamingServer[clusterpb.HeartbeatRequest, clusterpb.HeartbeatResponse]) error {
	for {
		if _, err := srv.Recv(); err != nil {
			return nil
		}
		c.received.Add(1)
	}
}

// TestHeartbeatExpectsAnswers: a heartbeat stream whose answers stop is
// given up with errNoHeartbeatAnswer (workerHeartbeat.run then has the
// resolver re-check the leader and reconnects), instead of sending into
// the void for as long as TCP keeps the connection.
func TestHeartbeatExpectsAnswers(t *testing.T) {
	fake := &silentCurator{}
	cc := testutil.ServePlain(t, func(srv *grpc.Server) { clusterpb.RegisterCuratorServer(srv, fake) })
	res := rpc.NewResolver(slog.New(slog.DiscardHandler), nil)
	defer res.Close()
	conn := &CuratorConnection{Resolver: res, Conn: cc}

	// Bounded generously for a loaded machine; the timeout is
	// heartbeatAnswerTimeout.
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	w := &workerHeartbeat{}
	var b backoff
	start := time.Now()
	err := w.heartbeat(ctx, conn, &b)
	if !errors.Is(err, errNoHeartbeatAnswer) {
		t.Fatalf("heartbeat to a silent curator ended with %v, want errNoHeartbeatAnswer", err)
	}
	if fake.received.Load() == 0 {
		t.Error("the curator received no heartbeat")
	}
	t.Logf("gave up after %v and %d unanswered heartbeats", time.Since(start).Round(100*time.Millisecond), fake.received.Load())
}
