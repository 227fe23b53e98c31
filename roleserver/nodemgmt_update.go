package roleserver

import (
	"errors"
	"io"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"plinth.dev/plinth/api/clusterpb"
	"plinth.dev/plinth/platform/update"
	"plinth.dev/plinth/roleserver/rpc"
)

// Updater is the node's A/B update (update.Node, set up by init).
type Updater interface {
	Begin(manifest []byte) (*update.Session, error)
	Status() update.Snapshot
}

// software is the status entry of a node's slot and updates (nil for a
// node without slots).
func software(s update.Snapshot) *clusterpb.NodeSoftware {
	if s.Slot == "" {
		return nil
	}
	out := &clusterpb.NodeSoftware{Slot: s.Slot, Board: s.Board}
	if p := s.Pending; p != nil {
		out.Pending = &clusterpb.PendingUpdate{Version: p.Version, Slot: p.To, Phase: string(p.Phase)}
	}
	if f := s.LastFailed; f != nil {
		out.LastFailed = &clusterpb.FailedUpdate{Version: f.Version, Slot: f.Slot, Reason: f.Reason, TimeUnixNanos: f.Time * 1e9}
	}
	return out
}

// updateCode maps an update's error to the status code the caller
// decides on.
func updateCode(err error) codes.Code {
	switch {
	case errors.Is(err, update.ErrNoSlots), errors.Is(err, update.ErrBusy):
		return codes.FailedPrecondition
	case errors.Is(err, update.ErrRejected):
		return codes.InvalidArgument
	}
	return codes.Internal
}

// Update: see node_management.proto.
func (m *nodeManagement) Update(srv grpc.BidiStreamingServer[clusterpb.UpdateRequest, clusterpb.UpdateResponse]) error {
	if m.w.updates == nil {
		return status.Error(codes.Unimplemented, "this node cannot install updates")
	}
	first, err := srv.Recv()
	if err != nil {
		return err
	}
	start := first.GetStart()
	if start == nil {
		return status.Error(codes.InvalidArgument, "the first message must be UpdateStart with the image's manifest")
	}
	sess, err := m.w.updates.Begin(start.GetManifest())
	if err != nil {
		return status.Error(updateCode(err), err.Error())
	}
	defer sess.Close()
	m.log.Warn("update requested through NodeManagement", "caller", rpc.PeerFrom(srv.Context()).Kind.String(), "version", sess.Version(), "slot", sess.Slot())
	if err := srv.Send(&clusterpb.UpdateResponse{Kind: &clusterpb.UpdateResponse_Accepted{Accepted: &clusterpb.UpdateAccepted{
		Slot: sess.Slot(), Artefacts: sess.Artefacts()}}}); err != nil {
		return err
	}
	progress := func(p update.Progress) {
		m.log.Info("update: "+p.Phase, "done", p.Done, "total", p.Total)
		srv.Send(&clusterpb.UpdateResponse{Kind: &clusterpb.UpdateResponse_Progress{Progress: &clusterpb.UpdateProgress{
			Phase: p.Phase, DoneBytes: p.Done, TotalBytes: p.Total}}})
	}
	if err := sess.Install(srv.Context(), &updateStream{srv: srv}, progress); err != nil {
		m.log.Error("update failed", "version", sess.Version(), "err", err)
		return status.Error(updateCode(err), err.Error())
	}
	reboot := start.GetReboot() && m.w.power != nil
	if err := srv.Send(&clusterpb.UpdateResponse{Kind: &clusterpb.UpdateResponse_Done{Done: &clusterpb.UpdateDone{
		Slot: sess.Slot(), Version: sess.Version(), Rebooting: reboot}}}); err != nil {
		return err
	}
	if reboot {
		m.log.Warn("rebooting into the new slot once", "slot", sess.Slot())
		// After the status worker's next push, so the cluster lists the
		// update as ready rather than still writing while the node is away.
		time.AfterFunc(statusRefresh+time.Second, func() { m.w.power(true) })
	}
	return nil
}

// updateStream reads the UpdateData chunks of an Update call as one
// stream; the caller closing its side is the end.
type updateStream struct {
	srv  grpc.BidiStreamingServer[clusterpb.UpdateRequest, clusterpb.UpdateResponse]
	rest []byte
}

func (u *updateStream) Read(p []byte) (int, error) {
	for len(u.rest) == 0 {
		req, err := u.srv.Recv()
		if err == io.EOF {
			return 0, io.EOF
		}
		if err != nil {
			return 0, err
		}
		if req.GetData() == nil {
			return 0, status.Error(codes.InvalidArgument, "after UpdateStart only UpdateData may follow")
		}
		u.rest = req.GetData().GetData()
	}
	n := copy(p, u.rest)
	u.rest = u.rest[n:]
	return n, nil
}
