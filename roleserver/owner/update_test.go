package owner

import (
	"bytes"
	"crypto/ed25519"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"

	"plinth.dev/plinth/api/clusterpb"
	"plinth.dev/plinth/internal/testutil/fakecluster"
)

// TestUpdateSendsSignature: ReadUpdateImage reads manifest.sig next to
// the manifest, and Update sends it and a downgrade statement with the
// manifest. An image without manifest.sig is sent unsigned (the node's
// policy refuses it, not the tool), and the node's refusal comes back as
// a RefusedError naming the node and its reason, with nothing sent.
func TestUpdateSendsSignature(t *testing.T) {
	ca := fakecluster.NewCA(t, "cluster")
	key := fakecluster.NewKey(t)
	f := fakecluster.New(t, fakecluster.Config{CA: ca, OwnerKey: key})
	c := ownerClient(t, f, key, f.Addr)
	c.SetNodeEndpoint(f.Node.ID(), f.NodeAddr)

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
	_, err = c.Update(ctx(t), f.Node.ID(), img, UpdateStage, nil)
	var refused *RefusedError
	if !errors.As(err, &refused) || status.Code(err) != codes.InvalidArgument || refused.Node != f.Node.ID() ||
		!strings.Contains(err.Error(), "node "+f.Node.ID()+" refused the image of version v2: update: image refused: the image is not signed (no manifest.sig)") {
		t.Fatalf("unsigned image: %v, want the node's refusal", err)
	}
	if start, received := f.LastUpdate(); len(start.GetManifestSignature()) != 0 || received != 0 {
		t.Errorf("unsigned: the node got signature %x and %d bytes", start.GetManifestSignature(), received)
	}

	sig := ed25519.Sign(fakecluster.NewKey(t), manifest)
	if err := os.WriteFile(filepath.Join(dir, "manifest.sig"), sig, 0o644); err != nil {
		t.Fatal(err)
	}
	if img, err = ReadUpdateImage(dir); err != nil || !bytes.Equal(img.Signature, sig) {
		t.Fatalf("signed image: %x, %v", img.Signature, err)
	}
	img.Downgrade = &clusterpb.SignedStatement{Body: []byte(`{"kind":"plinth.downgrade/v1"}`)}
	done, err := c.Update(ctx(t), f.Node.ID(), img, UpdateStage, nil)
	if err != nil || !done.GetStaged() {
		t.Fatalf("signed image: %v, %v", done, err)
	}
	if st, received := f.LastUpdate(); !bytes.Equal(st.GetManifest(), manifest) || !bytes.Equal(st.GetManifestSignature(), sig) || !proto.Equal(st.GetDowngrade(), img.Downgrade) || !st.GetStage() || received != 5 {
		t.Errorf("the node got %v and %d bytes", st, received)
	}
}
