package owner

import (
	"bytes"
	"crypto/ed25519"
	"errors"
	"io"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"

	"plinth.dev/plinth/api/clusterpb"
)

// updateNode is the fake node's side of NodeManagement.Update: it keeps
// the UpdateStart it got and refuses an unsigned image as a node does
// (InvalidArgument, before asking for anything); a signed one it takes
// whole and answers done.
var updateNode struct {
	sync.Mutex
	start    *clusterpb.UpdateStart
	received int
}

func (f *fakeCluster) Update(s grpc.BidiStreamingServer[clusterpb.UpdateRequest, clusterpb.UpdateResponse]) error {
	if err := f.owner(s.Context()); err != nil {
		return err
	}
	first, err := s.Recv()
	if err != nil {
		return err
	}
	start := first.GetStart()
	updateNode.Lock()
	updateNode.start, updateNode.received = proto.Clone(start).(*clusterpb.UpdateStart), 0
	updateNode.Unlock()
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
		updateNode.Lock()
		updateNode.received += len(r.GetData().GetData())
		updateNode.Unlock()
	}
	return s.Send(&clusterpb.UpdateResponse{Kind: &clusterpb.UpdateResponse_Done{Done: &clusterpb.UpdateDone{Slot: "b", Version: "v2", Staged: true}}})
}

// TestUpdateSendsSignature: ReadUpdateImage reads manifest.sig next to
// the manifest, and Update sends it and allow_downgrade with the
// manifest. An image without manifest.sig is sent unsigned (the node's
// policy refuses it, not the tool), and the node's refusal comes back as
// a RefusedError naming the node and its reason, with nothing sent.
func TestUpdateSendsSignature(t *testing.T) {
	ca := newCA(t, "cluster")
	key := newKey(t)
	f := newFakeCluster(t, ca, key.Public().(ed25519.PublicKey))
	c := ownerClient(t, f, key, f.addr)
	c.SetNodeEndpoint(f.node.ID(), f.nodeAddr)

	dir := t.TempDir()
	manifest := []byte(`{"board":"qemu-x86_64","version":"v2","release":9,"artefacts":{"system.img":{"size":3},"plinth-b.efi":{"size":2}}}`)
	for name, data := range map[string][]byte{"manifest.json": manifest, "system.img": []byte("sys"), "plinth-b.efi": []byte("uk")} {
		if err := os.WriteFile(filepath.Join(dir, name), data, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	img, err := ReadUpdateImage(dir)
	if err != nil || img.Signature != nil || img.Release != 9 {
		t.Fatalf("unsigned image: %+v, %v", img, err)
	}
	_, err = c.Update(ctx(t), f.node.ID(), img, UpdateStage, nil)
	var refused *RefusedError
	if !errors.As(err, &refused) || status.Code(err) != codes.InvalidArgument || refused.Node != f.node.ID() ||
		!strings.Contains(err.Error(), "node "+f.node.ID()+" refused the image of version v2: update: image refused: the image is not signed (no manifest.sig)") {
		t.Fatalf("unsigned image: %v, want the node's refusal", err)
	}
	updateNode.Lock()
	if len(updateNode.start.GetManifestSignature()) != 0 || updateNode.received != 0 {
		t.Errorf("unsigned: the node got signature %x and %d bytes", updateNode.start.GetManifestSignature(), updateNode.received)
	}
	updateNode.Unlock()

	sig := ed25519.Sign(newKey(t), manifest)
	if err := os.WriteFile(filepath.Join(dir, "manifest.sig"), sig, 0o644); err != nil {
		t.Fatal(err)
	}
	if img, err = ReadUpdateImage(dir); err != nil || !bytes.Equal(img.Signature, sig) {
		t.Fatalf("signed image: %x, %v", img.Signature, err)
	}
	img.AllowDowngrade = true
	done, err := c.Update(ctx(t), f.node.ID(), img, UpdateStage, nil)
	if err != nil || !done.GetStaged() {
		t.Fatalf("signed image: %v, %v", done, err)
	}
	updateNode.Lock()
	defer updateNode.Unlock()
	if st := updateNode.start; !bytes.Equal(st.GetManifest(), manifest) || !bytes.Equal(st.GetManifestSignature(), sig) || !st.GetAllowDowngrade() || !st.GetStage() || updateNode.received != 5 {
		t.Errorf("the node got %v and %d bytes", st, updateNode.received)
	}
}
