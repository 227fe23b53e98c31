package roleserver

import (
	"bytes"
	"context"
	"io"
	"log/slog"
	"sync/atomic"
	"testing"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"plinth.dev/plinth/api/clusterpb"
	"plinth.dev/plinth/platform/event/memory"
	"plinth.dev/plinth/platform/update"
	"plinth.dev/plinth/roleserver/internal/testutil"
)

// fakeUpdater refuses every update as CheckRelease would and keeps what
// Begin was asked.
type fakeUpdater struct {
	slot  string
	begun []update.Request
}

func (f *fakeUpdater) Begin(req update.Request) (*update.Session, error) {
	f.begun = append(f.begun, req)
	return nil, &update.ReleaseError{Refusal: update.RefusedUnsigned, Keys: len(req.ReleaseKeys)}
}
func (f *fakeUpdater) Activate(string) (update.Pending, error) {
	return update.Pending{}, update.ErrNotStaged
}
func (f *fakeUpdater) Cancel(string) (update.Pending, error) {
	return update.Pending{}, update.ErrNotStaged
}
func (f *fakeUpdater) Status() update.Snapshot { return update.Snapshot{Slot: f.slot} }

// policyCurator answers GetClusterInfo with its release keys.
type policyCurator struct {
	clusterpb.UnimplementedManagementServer
	keys  [][]byte
	calls atomic.Int32
}

func (p *policyCurator) GetClusterInfo(context.Context, *clusterpb.GetClusterInfoRequest) (*clusterpb.GetClusterInfoResponse, error) {
	p.calls.Add(1)
	return &clusterpb.GetClusterInfoResponse{Configuration: &clusterpb.ClusterConfiguration{ReleaseKeys: p.keys}}, nil
}

// startStream is an Update call's server side that receives one
// UpdateStart.
type startStream struct {
	grpc.ServerStream
	start *clusterpb.UpdateStart
	sent  bool
}

func (s *startStream) Context() context.Context { return context.Background() }
func (s *startStream) Recv() (*clusterpb.UpdateRequest, error) {
	if s.sent {
		return nil, io.EOF
	}
	s.sent = true
	return &clusterpb.UpdateRequest{Kind: &clusterpb.UpdateRequest_Start{Start: s.start}}, nil
}
func (s *startStream) Send(*clusterpb.UpdateResponse) error { return nil }

// TestUpdateReadsReleaseKeys: Update checks an image against the
// cluster's release keys as the curator has them now, with the
// signature and allow_downgrade the caller sent; a refusal is
// InvalidArgument with the node's reason. Without a curator connection
// the update is unavailable (the node cannot check the image), and a
// network-booted node says so before the curator is asked.
func TestUpdateReadsReleaseKeys(t *testing.T) {
	cur := &policyCurator{keys: [][]byte{bytes.Repeat([]byte{7}, 32), bytes.Repeat([]byte{8}, 32)}}
	cc := testutil.ServePlain(t, func(srv *grpc.Server) { clusterpb.RegisterManagementServer(srv, cur) })

	upd := &fakeUpdater{slot: "a"}
	w := &workerNodeMgmt{updates: upd, curator: new(memory.Value[*CuratorConnection])}
	w.curator.Set(nil)
	m := &nodeManagement{w: w, log: slog.New(slog.DiscardHandler)}
	start := &clusterpb.UpdateStart{Manifest: []byte("{}"), ManifestSignature: []byte("sig"), AllowDowngrade: true}

	if err := m.Update(&startStream{start: start}); status.Code(err) != codes.Unavailable || len(upd.begun) != 0 {
		t.Errorf("without a curator connection: %v (Begin called %d times)", err, len(upd.begun))
	}
	w.curator.Set(&CuratorConnection{Conn: cc})
	err := m.Update(&startStream{start: start})
	if status.Code(err) != codes.InvalidArgument || status.Convert(err).Message() != "update: image refused: the image is not signed (no manifest.sig)" {
		t.Errorf("refused: %v", err)
	}
	if len(upd.begun) != 1 {
		t.Fatalf("Begin called %d times", len(upd.begun))
	}
	if r := upd.begun[0]; !bytes.Equal(r.Signature, []byte("sig")) || !r.AllowDowngrade || len(r.ReleaseKeys) != 2 || !bytes.Equal(r.ReleaseKeys[1], cur.keys[1]) {
		t.Errorf("Begin got %+v", r)
	}
	upd.slot = ""
	if err := m.Update(&startStream{start: start}); status.Code(err) != codes.FailedPrecondition || cur.calls.Load() != 1 {
		t.Errorf("network boot: %v (curator asked %d times)", err, cur.calls.Load())
	}
}
