package fakecluster

import (
	"io"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"

	"plinth.dev/plinth/api/clusterpb"
)

// Logs answers two entries, "hello" and "world", of the DN asked for.
func (f *Cluster) Logs(r *clusterpb.LogsRequest, s grpc.ServerStreamingServer[clusterpb.LogsResponse]) error {
	if err := f.owner(s.Context()); err != nil {
		return err
	}
	return s.Send(&clusterpb.LogsResponse{Entries: []*clusterpb.LogEntry{{Dn: r.GetDn(), Message: "hello"}, {Dn: r.GetDn(), Message: "world"}}})
}

// Update is the node's side of an update: it keeps the UpdateStart it got
// (LastUpdate) and refuses an unsigned image as a node does
// (InvalidArgument, before asking for anything); a signed one it takes
// whole into slot b and answers staged.
func (f *Cluster) Update(s grpc.BidiStreamingServer[clusterpb.UpdateRequest, clusterpb.UpdateResponse]) error {
	if err := f.owner(s.Context()); err != nil {
		return err
	}
	first, err := s.Recv()
	if err != nil {
		return err
	}
	start := first.GetStart()
	f.mu.Lock()
	f.update = updateRecord{start: proto.Clone(start).(*clusterpb.UpdateStart)}
	f.mu.Unlock()
	if len(start.GetManifestSignature()) == 0 {
		return status.Error(codes.InvalidArgument, "update: image refused: the image is not signed (no manifest.sig)")
	}
	if err := s.Send(&clusterpb.UpdateResponse{Kind: &clusterpb.UpdateResponse_Accepted{Accepted: &clusterpb.UpdateAccepted{
		Slot: "b", Artefacts: []string{"system.img", "plinth-b.efi"}}}}); err != nil {
		return err
	}
	for {
		r, err := s.Recv()
		if err == io.EOF {
			break
		}
		if err != nil {
			return err
		}
		f.mu.Lock()
		f.update.received += len(r.GetData().GetData())
		f.mu.Unlock()
	}
	return s.Send(&clusterpb.UpdateResponse{Kind: &clusterpb.UpdateResponse_Done{Done: &clusterpb.UpdateDone{Slot: "b", Version: "v2", Staged: true}}})
}
