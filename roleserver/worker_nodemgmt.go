package roleserver

import (
	"context"
	"fmt"
	"log/slog"
	"net"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"plinth.dev/plinth/api/clusterpb"
	"plinth.dev/plinth/platform/event/memory"
	"plinth.dev/plinth/platform/logtree"
	"plinth.dev/plinth/platform/supervisor"
	"plinth.dev/plinth/roleserver/identity"
	"plinth.dev/plinth/roleserver/kubernetes"
	"plinth.dev/plinth/roleserver/kubernetes/auditlog"
	"plinth.dev/plinth/roleserver/rpc"
)

// workerNodeMgmt serves NodeManagement (Logs, Status, Reboot, PowerOff,
// Update: nodemgmt_update.go) with this node's credentials.
//
// It consumes the credentials, the node's log tree, its status, the
// supervisor's runnables (through its context: supervisor.Snapshot) and
// (for Update) the curator connection; it produces nothing but the API,
// and the calls of power.
type workerNodeMgmt struct {
	// inputs
	credentials *memory.Value[*identity.Credentials]
	// listen is the address to serve on.
	listen string
	// logTree is served by Logs (nil: the node keeps no logs).
	logTree *logtree.Tree
	// auditDir is the audit log's store (auditlog): Logs' backlog of
	// kubernetes.AuditDN ("": the stream's alone).
	auditDir string
	// status is served by Status, given the supervisor's runnables.
	status func([]supervisor.Status) *clusterpb.NodeStatus

	// output: power reboots (true) or powers off (false) the node (nil:
	// Reboot and PowerOff fail).
	power func(reboot bool)
	// updates installs A/B updates (nil: Update fails).
	updates Updater
	// curator is the connection Update reads the cluster's release keys
	// through (nil, or no connection yet: Update fails).
	curator *memory.Value[*CuratorConnection]
	// releaseTrust verifies them (releasetrust.go).
	releaseTrust *releaseTrust
}

func (w *workerNodeMgmt) run(ctx context.Context) error {
	log := supervisor.Logger(ctx)
	creds, err := wait(ctx, w.credentials)
	if err != nil {
		return err
	}
	lis, err := net.Listen("tcp", w.listen)
	if err != nil {
		return fmt.Errorf("nodemgmt: %w", err)
	}
	srv := rpc.NewServer(creds, log)
	// A call's own context is not in the supervisor's tree: the worker's
	// is.
	runnables := func() []supervisor.Status { return supervisor.Snapshot(ctx) }
	clusterpb.RegisterNodeManagementServer(srv, &nodeManagement{w: w, log: log, runnables: runnables})
	errc := make(chan error, 1)
	go func() { errc <- srv.Serve(lis) }()
	log.Info("serving NodeManagement", "address", lis.Addr().String())
	supervisor.Signal(ctx, supervisor.SignalHealthy)
	select {
	case <-ctx.Done():
		srv.Stop()
		return ctx.Err()
	case err := <-errc:
		return fmt.Errorf("nodemgmt: %w", err)
	}
}

// nodeManagement is the NodeManagement server of a workerNodeMgmt.
type nodeManagement struct {
	clusterpb.UnimplementedNodeManagementServer
	w   *workerNodeMgmt
	log *slog.Logger
	// runnables are the supervisor's, for Status (nil: none).
	runnables func() []supervisor.Status
}

// logsBatch is the most entries sent in one LogsResponse.
const logsBatch = 128

func (m *nodeManagement) Logs(req *clusterpb.LogsRequest, srv grpc.ServerStreamingServer[clusterpb.LogsResponse]) error {
	lt := m.w.logTree
	if lt == nil {
		return status.Error(codes.Unavailable, "this node keeps no logs")
	}
	if req.GetBacklog() < -1 {
		return status.Error(codes.InvalidArgument, "backlog must be -1, 0 or positive")
	}
	match := logMatcher(req.GetDn(), req.GetRecursive())
	prefix := req.GetDn()
	ctx := srv.Context()

	// Subscribe before reading the backlog so nothing logged in between is
	// lost; entries seen in both are sent once.
	var live <-chan logtree.Entry
	if req.GetFollow() {
		sctx, cancel := context.WithCancel(ctx)
		defer cancel()
		live = lt.Subscribe(sctx, prefix)
	}
	var backlog []logtree.Entry
	// last is the newest entry of the backlog snapshot: live entries up to
	// it were in the snapshot.
	var last time.Time
	// seen are the audit events sent from the store, whose live entries
	// carry another time.
	var seen map[string]bool
	if prefix == kubernetes.AuditDN && m.w.auditDir != "" {
		var err error
		if backlog, seen, err = auditBacklog(m.w.auditDir, req.GetBacklog()); err != nil {
			return status.Errorf(codes.Internal, "reading the audit log: %v", err)
		}
	} else if req.GetBacklog() != 0 {
		snap := lt.Read(prefix, 0)
		if len(snap) > 0 {
			last = snap[len(snap)-1].Time
		}
		for _, e := range snap {
			if match(e) {
				backlog = append(backlog, e)
			}
		}
		if n := req.GetBacklog(); n > 0 && int64(len(backlog)) > n {
			backlog = backlog[int64(len(backlog))-n:]
		}
	}
	for len(backlog) > 0 {
		n := min(len(backlog), logsBatch)
		if err := srv.Send(&clusterpb.LogsResponse{Entries: logEntries(backlog[:n])}); err != nil {
			return err
		}
		backlog = backlog[n:]
	}
	if live == nil {
		return nil
	}
	for {
		var batch []logtree.Entry
		select {
		case e, ok := <-live:
			if !ok {
				return ctx.Err()
			}
			batch = append(batch, e)
		case <-ctx.Done():
			return ctx.Err()
		}
	more:
		for len(batch) < logsBatch {
			select {
			case e, ok := <-live:
				if !ok {
					break more
				}
				batch = append(batch, e)
			default:
				break more
			}
		}
		var out []logtree.Entry
		for _, e := range batch {
			// Already sent as backlog.
			if !last.IsZero() && !e.Time.After(last) || seen[e.Message] {
				continue
			}
			if match(e) {
				out = append(out, e)
			}
		}
		if len(out) > 0 {
			if err := srv.Send(&clusterpb.LogsResponse{Entries: logEntries(out)}); err != nil {
				return err
			}
		}
	}
}

// logMatcher selects entries of dn ("" = the whole tree when recursive,
// "root" otherwise), or below it when recursive.
func logMatcher(dn string, recursive bool) func(logtree.Entry) bool {
	if recursive {
		return func(logtree.Entry) bool { return true } // Read/Subscribe filter by prefix
	}
	if dn == "" {
		dn = "root"
	}
	return func(e logtree.Entry) bool { return e.DN == dn }
}

func logEntries(es []logtree.Entry) []*clusterpb.LogEntry {
	out := make([]*clusterpb.LogEntry, len(es))
	for i, e := range es {
		out[i] = &clusterpb.LogEntry{
			TimeUnixNanos: e.Time.UnixNano(),
			Level:         levelName(e.Level),
			Dn:            e.DN,
			Message:       e.Message,
			Attributes:    append([]string(nil), e.Attrs...),
		}
	}
	return out
}

func levelName(l slog.Level) string {
	switch {
	case l >= slog.LevelError:
		return "ERROR"
	case l >= slog.LevelWarn:
		return "WARNING"
	case l >= slog.LevelInfo:
		return "INFO"
	}
	return "DEBUG"
}

func (m *nodeManagement) Status(context.Context, *clusterpb.StatusRequest) (*clusterpb.StatusResponse, error) {
	var runnables []supervisor.Status
	if m.runnables != nil {
		runnables = m.runnables()
	}
	resp := &clusterpb.StatusResponse{Status: m.w.status(runnables)}
	for _, r := range runnables {
		rs := &clusterpb.RunnableStatus{
			Dn: r.DN, State: string(r.State), Restarts: int32(r.Restarts), LastError: r.LastErr,
		}
		if r.PID != 0 {
			if u, err := supervisor.ProcessUsage(r.PID); err == nil {
				rs.Process = &clusterpb.ProcessUsage{Pid: int32(r.PID), CpuSeconds: u.CPUSeconds,
					RssBytes: u.RSSBytes, PeakRssBytes: u.PeakRSSBytes}
			}
		}
		resp.Runnables = append(resp.Runnables, rs)
	}
	return resp, nil
}

// powerDelay lets the answer to Reboot/PowerOff reach the caller first.
const powerDelay = 500 * time.Millisecond

func (m *nodeManagement) power(ctx context.Context, reboot bool) error {
	if m.w.power == nil {
		return status.Error(codes.Unimplemented, "this node cannot reboot or power off through the API")
	}
	what := "power off"
	if reboot {
		what = "reboot"
	}
	m.log.Warn(what+" requested through NodeManagement", "caller", rpc.PeerFrom(ctx).Kind.String())
	m.powerLater(reboot)
	return nil
}

// powerLater reboots or powers off after powerDelay.
func (m *nodeManagement) powerLater(reboot bool) {
	time.AfterFunc(powerDelay, func() { m.w.power(reboot) })
}

func (m *nodeManagement) Reboot(ctx context.Context, _ *clusterpb.RebootRequest) (*clusterpb.RebootResponse, error) {
	return &clusterpb.RebootResponse{}, m.power(ctx, true)
}

func (m *nodeManagement) PowerOff(ctx context.Context, _ *clusterpb.PowerOffRequest) (*clusterpb.PowerOffResponse, error) {
	return &clusterpb.PowerOffResponse{}, m.power(ctx, false)
}

// auditBacklog is the last n (-1: all; 0: none) audit events of the
// store in dir, as log entries of kubernetes.AuditDN, and the lines of
// those of the last minute, which the live stream may bring again.
func auditBacklog(dir string, n int64) ([]logtree.Entry, map[string]bool, error) {
	events, err := auditlog.Read(dir)
	if err != nil {
		return nil, nil, err
	}
	if n >= 0 && int64(len(events)) > n {
		events = events[int64(len(events))-n:]
	}
	out := make([]logtree.Entry, len(events))
	seen := map[string]bool{}
	for i, e := range events {
		out[i] = logtree.Entry{Time: e.Time, Level: slog.LevelInfo, DN: kubernetes.AuditDN, Message: e.Line}
		if time.Since(e.Time) < time.Minute {
			seen[e.Line] = true
		}
	}
	return out, seen, nil
}
