package roleserver

import (
	"bytes"
	"context"
	"crypto/ed25519"
	"crypto/rand"
	"encoding/hex"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"plinth.dev/plinth/api/clusterpb"
	"plinth.dev/plinth/platform/event/memory"
	"plinth.dev/plinth/platform/releasekeys"
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

// policyCurator answers GetClusterInfo with its policy: a curator that
// may lie.
type policyCurator struct {
	clusterpb.UnimplementedManagementServer
	mu     sync.Mutex
	policy *clusterpb.ClusterConfiguration
	calls  atomic.Int32
}

func (p *policyCurator) set(cfg *clusterpb.ClusterConfiguration) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.policy = cfg
}

func (p *policyCurator) GetClusterInfo(context.Context, *clusterpb.GetClusterInfoRequest) (*clusterpb.GetClusterInfoResponse, error) {
	p.calls.Add(1)
	p.mu.Lock()
	defer p.mu.Unlock()
	return &clusterpb.GetClusterInfoResponse{Configuration: p.policy}, nil
}

// chainPolicy is a policy with chain as its release keys, and keys as
// what it claims they come to.
func chainPolicy(keys [][]byte, chain ...releasekeys.Signed) *clusterpb.ClusterConfiguration {
	cfg := &clusterpb.ClusterConfiguration{ReleaseKeys: keys}
	for _, s := range chain {
		cfg.ReleaseKeyChain = append(cfg.ReleaseKeyChain, clusterpb.NewSignedStatement(s))
	}
	return cfg
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
// cluster's release keys as this node verifies the curator's chain now
// (from its image's key), with the signature and downgrade statement the
// caller sent; a refusal is InvalidArgument with the node's reason. A
// curator that lies (keys no chain leads to, a chain of its own, an old
// chain replayed once the node saw a newer one) gets FailedPrecondition
// and nothing begins. Without a curator connection the update is
// unavailable (the node cannot check the image), and a network-booted
// node says so before the curator is asked.
func TestUpdateReadsReleaseKeys(t *testing.T) {
	k1, k1priv, _ := ed25519.GenerateKey(rand.Reader)
	k2, k2priv, _ := ed25519.GenerateKey(rand.Reader)
	kx, kxpriv, _ := ed25519.GenerateKey(rand.Reader)
	set := func(prev *releasekeys.Signed, signers []ed25519.PrivateKey, keys ...ed25519.PublicKey) releasekeys.Signed {
		var raw [][]byte
		for _, k := range keys {
			raw = append(raw, k)
		}
		b, err := releasekeys.NextKeySet(prev, raw)
		if err != nil {
			t.Fatal(err)
		}
		return releasekeys.Sign(b, signers...)
	}
	g := set(nil, []ed25519.PrivateKey{k1priv}, k1)
	v2 := set(&g, []ed25519.PrivateKey{k1priv, k2priv}, k1, k2)
	cur := &policyCurator{policy: chainPolicy([][]byte{k1, k2}, g, v2)}
	cc := testutil.ServePlain(t, func(srv *grpc.Server) { clusterpb.RegisterManagementServer(srv, cur) })

	imageKey := filepath.Join(t.TempDir(), "release.pub")
	if err := os.WriteFile(imageKey, []byte(hex.EncodeToString(k1)+"\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	upd := &fakeUpdater{slot: "a"}
	w := &workerNodeMgmt{updates: upd, curator: new(memory.Value[*CuratorConnection]), releaseTrust: &releaseTrust{imageKey: imageKey}}
	w.curator.Set(nil)
	m := &nodeManagement{w: w, log: slog.New(slog.DiscardHandler)}
	down := &clusterpb.SignedStatement{Body: []byte(`{"kind":"plinth.downgrade/v1"}`)}
	start := &clusterpb.UpdateStart{Manifest: []byte("{}"), ManifestSignature: []byte("sig"), Downgrade: down}

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
	if r := upd.begun[0]; !bytes.Equal(r.Signature, []byte("sig")) || r.Downgrade == nil || !bytes.Equal(r.Downgrade.Body, down.Body) ||
		len(r.ReleaseKeys) != 2 || !bytes.Equal(r.ReleaseKeys[1], k2) {
		t.Errorf("Begin got %+v", r)
	}

	// The curator lies; the node begins nothing.
	v3x := set(&v2, []ed25519.PrivateKey{kxpriv}, k2, kx)
	fg := set(nil, []ed25519.PrivateKey{kxpriv}, kx)
	for what, cfg := range map[string]*clusterpb.ClusterConfiguration{
		"keys the chain does not name":       chainPolicy([][]byte{kx}, g, v2),
		"a key set no current key signed":    chainPolicy([][]byte{k2, kx}, g, v2, v3x),
		"a chain of its own":                 chainPolicy([][]byte{kx}, fg),
		"the chain before v2, replayed":      chainPolicy([][]byte{k1}, g),
		"no chain, the keys the owner wants": chainPolicy([][]byte{kx}),
	} {
		cur.set(cfg)
		upd.begun = nil
		err := m.Update(&startStream{start: start})
		if what == "keys the chain does not name" {
			// The chain holds: the node uses its keys, not the field.
			if len(upd.begun) != 1 || len(upd.begun[0].ReleaseKeys) != 2 || !bytes.Equal(upd.begun[0].ReleaseKeys[0], k1) {
				t.Errorf("%s: Begin got %+v", what, upd.begun)
			}
			continue
		}
		if status.Code(err) != codes.FailedPrecondition || len(upd.begun) != 0 || !strings.Contains(err.Error(), "release keys") {
			t.Errorf("%s: %v (Begin called %d times); want FailedPrecondition", what, err, len(upd.begun))
		}
	}
	cur.set(chainPolicy(nil, g, v2))
	upd.slot = ""
	calls := cur.calls.Load()
	if err := m.Update(&startStream{start: start}); status.Code(err) != codes.FailedPrecondition || cur.calls.Load() != calls {
		t.Errorf("network boot: %v (curator asked %d times)", err, cur.calls.Load()-calls)
	}
}
