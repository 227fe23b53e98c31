package roleserver

import (
	"context"
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
	Begin(req update.Request) (*update.Session, error)
	Activate(version string) (update.Pending, error)
	Cancel(version string) (update.Pending, error)
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
	case errors.Is(err, update.ErrNoSlots), errors.Is(err, update.ErrBusy), errors.Is(err, update.ErrNotStaged):
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
	if start.GetStage() && start.GetReboot() {
		return status.Error(codes.InvalidArgument, "a staged update waits for ActivateUpdate: stage and reboot exclude each other")
	}
	caller := "unknown"
	if p := rpc.PeerFrom(srv.Context()); p != nil {
		caller = p.Kind.String()
	}
	if m.w.updates.Status().Slot == "" {
		// Before asking the curator: a network-booted node says so
		// whatever the cluster's keys.
		return status.Error(updateCode(update.ErrNoSlots), update.ErrNoSlots.Error())
	}
	keys, err := m.releaseKeys(srv.Context())
	if err != nil {
		return err
	}
	req := update.Request{Manifest: start.GetManifest(), Signature: start.GetManifestSignature(), ReleaseKeys: keys}
	if d := start.GetDowngrade(); d != nil {
		s := d.Signed()
		req.Downgrade = &s
	}
	sess, err := m.w.updates.Begin(req)
	if err != nil {
		if errors.Is(err, update.ErrRejected) {
			m.log.Warn("update refused", "caller", caller, "err", err)
		}
		return status.Error(updateCode(err), err.Error())
	}
	defer sess.Close()
	m.log.Warn("update requested through NodeManagement", "caller", caller, "version", sess.Version(), "slot", sess.Slot(), "downgrade_statement", req.Downgrade != nil)
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
	if start.GetStage() {
		return srv.Send(&clusterpb.UpdateResponse{Kind: &clusterpb.UpdateResponse_Done{Done: &clusterpb.UpdateDone{
			Slot: sess.Slot(), Version: sess.Version(), Staged: true}}})
	}
	if _, err := sess.Activate(); err != nil {
		m.log.Error("update failed: activating it", "version", sess.Version(), "err", err)
		if _, cerr := sess.Cancel(); cerr != nil {
			m.log.Error("cancelling the update", "err", cerr)
		}
		return status.Error(updateCode(err), err.Error())
	}
	return srv.Send(&clusterpb.UpdateResponse{Kind: &clusterpb.UpdateResponse_Done{Done: m.activated(sess.Slot(), sess.Version(), start.GetReboot())}})
}

// releaseKeysTimeout bounds reading the cluster's release keys.
const releaseKeysTimeout = 30 * time.Second

// releaseKeys reads the cluster's chain of release keys from the
// curator (Management.GetClusterInfo, which a node may call:
// READ_CLUSTER_STATUS) and verifies it from where this node stands
// (releaseTrust): the newest key set's keys. Read for every update
// rather than kept: a key the owner removed signs nothing from then on.
// Without a curator connection (or an answer) the update is refused as
// unavailable: the node cannot tell a signed image from an unsigned one;
// a chain it cannot verify refuses it as a failed precondition.
func (m *nodeManagement) releaseKeys(ctx context.Context) ([][]byte, error) {
	var conn *CuratorConnection
	if m.w.curator != nil {
		conn = get(m.w.curator)
	}
	if conn == nil {
		return nil, status.Error(codes.Unavailable, "this node has no connection to the curator yet: it cannot read the cluster's release keys to check the image")
	}
	ctx, cancel := context.WithTimeout(ctx, releaseKeysTimeout)
	defer cancel()
	info, err := clusterpb.NewManagementClient(conn.Conn).GetClusterInfo(ctx, &clusterpb.GetClusterInfoRequest{})
	if err != nil {
		return nil, status.Errorf(codes.Unavailable, "reading the cluster's release keys from the curator: %v", err)
	}
	keys, err := m.w.releaseTrust.follow(info.GetConfiguration().ReleaseKeyChainSigned(), m.log)
	if err != nil {
		m.log.Error("update refused: the cluster's release keys", "err", err)
		return nil, status.Error(codes.FailedPrecondition, err.Error())
	}
	return keys, nil
}

// ActivateUpdate: see node_management.proto.
func (m *nodeManagement) ActivateUpdate(ctx context.Context, req *clusterpb.ActivateUpdateRequest) (*clusterpb.UpdateDone, error) {
	if m.w.updates == nil {
		return nil, status.Error(codes.Unimplemented, "this node cannot install updates")
	}
	p, err := m.w.updates.Activate(req.GetVersion())
	if err != nil {
		return nil, status.Error(updateCode(err), err.Error())
	}
	m.log.Warn("staged update activated through NodeManagement", "caller", rpc.PeerFrom(ctx).Kind.String(), "version", p.Version, "slot", p.To)
	return m.activated(p.To, p.Version, req.GetReboot()), nil
}

// activated answers for an update set to boot once and, with reboot,
// reboots into it.
func (m *nodeManagement) activated(slot, version string, reboot bool) *clusterpb.UpdateDone {
	reboot = reboot && m.w.power != nil
	if reboot {
		m.log.Warn("rebooting into the new slot once", "slot", slot)
		// After the status worker's next push, so the cluster lists the
		// update as ready rather than still writing while the node is away.
		time.AfterFunc(statusRefresh+time.Second, func() { m.w.power(true) })
	}
	return &clusterpb.UpdateDone{Slot: slot, Version: version, Rebooting: reboot}
}

// CancelUpdate: see node_management.proto.
func (m *nodeManagement) CancelUpdate(ctx context.Context, req *clusterpb.CancelUpdateRequest) (*clusterpb.CancelUpdateResponse, error) {
	if m.w.updates == nil {
		return nil, status.Error(codes.Unimplemented, "this node cannot install updates")
	}
	p, err := m.w.updates.Cancel(req.GetVersion())
	if err != nil {
		return nil, status.Error(updateCode(err), err.Error())
	}
	m.log.Warn("update cancelled through NodeManagement", "caller", rpc.PeerFrom(ctx).Kind.String(), "version", p.Version, "slot", p.To)
	return &clusterpb.CancelUpdateResponse{Slot: p.To, Version: p.Version}, nil
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
