package owner

import (
	"bytes"
	"context"
	"crypto/ed25519"
	"errors"
	"net"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"plinth.dev/plinth/api/clusterpb"
	"plinth.dev/plinth/internal/testutil/fakecluster"
	"plinth.dev/plinth/platform/pki"
	"plinth.dev/plinth/roleserver/identity"
)

func ctx(t *testing.T) context.Context {
	c, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	t.Cleanup(cancel)
	return c
}

func TestTakeOwnership(t *testing.T) {
	ca := fakecluster.NewCA(t, "cluster")
	key := fakecluster.NewKey(t)
	f := fakecluster.New(t, fakecluster.Config{CA: ca, OwnerKey: key})

	creds, info, err := TakeOwnership(ctx(t), f.Addr, key)
	if err != nil {
		t.Fatal(err)
	}
	if !creds.CA.Equal(ca.Certificate) || !identity.IsOwner(creds.Certificate) || !creds.PublicKey().Equal(key.Public()) {
		t.Errorf("credentials: CA %v, cert %v", creds.CA.Subject, creds.Certificate.Subject)
	}
	if got := info.GetDirectory().GetNodes(); len(got) != 1 || got[0].GetId() != f.Node.ID() {
		t.Errorf("directory %v", got)
	}

	// Another key than the bootstrap owner's gets nothing.
	if _, _, err := TakeOwnership(ctx(t), f.Addr, fakecluster.NewKey(t)); status.Code(err) != codes.PermissionDenied {
		t.Errorf("escrow with a stranger's key: %v, want PermissionDenied", err)
	}
}

// TestTakeOwnershipRejectsForeignCA: a server whose node certificate and
// owner certificate do not come from the same CA is refused, whichever CA
// it then claims is the cluster's.
func TestTakeOwnershipRejectsForeignCA(t *testing.T) {
	for _, tc := range []struct {
		name         string
		infoIsIssuer bool
		want         string
	}{
		// Reports the CA that signed its node certificate: the owner
		// certificate does not chain to it.
		{"owner cert from another CA", false, "owner certificate is not from the server's cluster CA"},
		// Reports the CA that signed the owner certificate: the server's
		// own certificate does not chain to it.
		{"server cert from another CA", true, "does not belong to the cluster CA it reports"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			key := fakecluster.NewKey(t)
			f := fakecluster.New(t, fakecluster.Config{CA: fakecluster.NewCA(t, "cluster"), OwnerKey: key})
			impostor := fakecluster.NewCA(t, "impostor")
			f.SetIssuer(impostor)
			if tc.infoIsIssuer {
				f.SetInfoCA(impostor)
			}
			creds, _, err := TakeOwnership(ctx(t), f.Addr, key)
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("got %v, %v; want error containing %q", creds, err, tc.want)
			}
		})
	}
}

// TestTakeOwnershipCAFingerprint: with --ca-fingerprint's option the
// cluster CA must have that fingerprint, or nothing is returned.
func TestTakeOwnershipCAFingerprint(t *testing.T) {
	ca := fakecluster.NewCA(t, "cluster")
	key := fakecluster.NewKey(t)
	f := fakecluster.New(t, fakecluster.Config{CA: ca, OwnerKey: key})

	want, err := pki.ParseFingerprint(pki.Fingerprint(ca.Certificate))
	if err != nil {
		t.Fatal(err)
	}
	creds, _, err := TakeOwnership(ctx(t), f.Addr, key, WithCAFingerprint(want))
	if err != nil || !creds.CA.Equal(ca.Certificate) {
		t.Fatalf("matching fingerprint: %v, %v", creds, err)
	}

	other, err := pki.ParseFingerprint(pki.Fingerprint(fakecluster.NewCA(t, "cluster").Certificate))
	if err != nil {
		t.Fatal(err)
	}
	before := f.EscrowCount()
	creds, info, err := TakeOwnership(ctx(t), f.Addr, key, WithCAFingerprint(other))
	if !errors.Is(err, ErrCAFingerprintMismatch) || creds != nil || info != nil {
		t.Errorf("another fingerprint: credentials %v, info %v, error %v; want ErrCAFingerprintMismatch and nothing else", creds != nil, info != nil, err)
	}
	// Refused in the handshake: the escrow proof never went out.
	if n := f.EscrowCount(); n != before {
		t.Errorf("escrow reached the server %d times despite the wrong CA", n-before)
	}
}

// TestRegisterParametersPinnedCA: register parameters carry the CA pinned
// at takeownership, and a cluster reporting another one is refused.
func TestRegisterParametersPinnedCA(t *testing.T) {
	ca := fakecluster.NewCA(t, "cluster")
	key := fakecluster.NewKey(t)
	f := fakecluster.New(t, fakecluster.Config{CA: ca, OwnerKey: key})
	c := ownerClient(t, f, key, f.Addr)
	r, err := c.RegisterParameters(ctx(t))
	if err != nil || !bytes.Equal(r.GetClusterCaCertificate(), ca.Certificate.Raw) {
		t.Fatalf("register parameters %v, %v", r, err)
	}

	f.SetInfoCA(fakecluster.NewCA(t, "impostor"))
	if r, err := c.RegisterParameters(ctx(t)); !errors.Is(err, ErrCAMismatch) || r != nil {
		t.Errorf("foreign CA reported: parameters returned %v, error %v; want ErrCAMismatch", r != nil, err)
	}
}

// TestRotateTicket: the rotated ticket is returned and is the one the
// cluster hands out from then on.
func TestRotateTicket(t *testing.T) {
	key := fakecluster.NewKey(t)
	f := fakecluster.New(t, fakecluster.Config{CA: fakecluster.NewCA(t, "cluster"), OwnerKey: key})
	c := ownerClient(t, f, key, f.Addr)
	old, err := c.Ticket(ctx(t))
	if err != nil {
		t.Fatal(err)
	}
	rotated, err := c.RotateTicket(ctx(t))
	if err != nil || len(rotated) != 32 || bytes.Equal(rotated, old) {
		t.Fatalf("RotateTicket: %x, %v (old %x)", rotated, err, old)
	}
	if now, err := c.Ticket(ctx(t)); err != nil || !bytes.Equal(now, rotated) {
		t.Errorf("ticket after rotation %x, %v; want %x", now, err, rotated)
	}
	f.SetOwnerCallError(status.Error(codes.PermissionDenied, "no"))
	if _, err := c.RotateTicket(ctx(t)); status.Code(err) != codes.PermissionDenied {
		t.Errorf("denied rotation: %v", err)
	}
}

func TestConfigRoundTrip(t *testing.T) {
	ca := fakecluster.NewCA(t, "cluster")
	key := fakecluster.NewKey(t)
	cert, err := identity.IssueOwnerCertificate(ca, key.Public().(ed25519.PublicKey))
	if err != nil {
		t.Fatal(err)
	}
	creds, err := identity.NewCredentials(key, cert.Raw, ca.Certificate.Raw)
	if err != nil {
		t.Fatal(err)
	}
	dir := filepath.Join(t.TempDir(), "plinth")
	in := &Config{
		Dir: dir, Key: key, Credentials: creds,
		Curators:      []string{"127.0.0.1:4001", "[2001:db8::1]:7835", "curator.example:7835"},
		NodeEndpoints: map[string]string{"plinth-a": "127.0.0.1:4002", "plinth-b": "127.0.0.1:4004"},
	}
	if err := in.Save(); err != nil {
		t.Fatal(err)
	}
	st, err := os.Stat(filepath.Join(dir, KeyFile))
	if err != nil || st.Mode().Perm() != 0o600 {
		t.Errorf("key file: %v, %v; want mode 0600", st, err)
	}
	out, err := LoadConfig(dir)
	if err != nil {
		t.Fatal(err)
	}
	if !out.Key.Equal(key) || !out.Credentials.Certificate.Equal(cert) || !out.Credentials.CA.Equal(ca.Certificate) {
		t.Error("credentials changed in the round trip")
	}
	if !slices.Equal(out.Curators, in.Curators) {
		t.Errorf("curators %v, want %v", out.Curators, in.Curators)
	}
	if len(out.NodeEndpoints) != 2 || out.NodeEndpoints["plinth-a"] != "127.0.0.1:4002" || out.NodeEndpoints["plinth-b"] != "127.0.0.1:4004" {
		t.Errorf("node endpoints %v", out.NodeEndpoints)
	}

	// Before takeownership: only the key, as `plinthctl params` wrote it.
	keyOnly := t.TempDir()
	if err := os.WriteFile(filepath.Join(keyOnly, KeyFile), mustPEM(t, key), 0o600); err != nil {
		t.Fatal(err)
	}
	c, err := LoadConfig(keyOnly)
	if err != nil || !c.Key.Equal(key) || c.Credentials != nil {
		t.Errorf("key-only config: %+v, %v", c, err)
	}
	if _, err := Dial(c); !errors.Is(err, ErrNotOwner) {
		t.Errorf("Dial without certificate: %v", err)
	}

	// A certificate for another key is refused rather than half-loaded.
	if err := os.WriteFile(filepath.Join(keyOnly, KeyFile), mustPEM(t, fakecluster.NewKey(t)), 0o600); err != nil {
		t.Fatal(err)
	}
	for _, f := range []string{CertFile, CAFile} {
		b, _ := os.ReadFile(filepath.Join(dir, f))
		os.WriteFile(filepath.Join(keyOnly, f), b, 0o600)
	}
	if _, err := LoadConfig(keyOnly); err == nil || !strings.Contains(err.Error(), "not for this key") {
		t.Errorf("mismatched key and certificate: %v", err)
	}

	if err := os.WriteFile(filepath.Join(dir, EndpointsFile), []byte("curator nope\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	if _, err := LoadConfig(dir); err == nil || !strings.Contains(err.Error(), "line 1") {
		t.Errorf("bad endpoints file: %v", err)
	}
	if _, err := LoadConfig(filepath.Join(dir, "missing")); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("missing dir: %v", err)
	}
}

func mustPEM(t *testing.T, k ed25519.PrivateKey) []byte {
	t.Helper()
	b, err := pki.PrivateKeyPEM(k)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// ownerClient takes ownership of f and returns a client for endpoints.
func ownerClient(t *testing.T, f *fakecluster.Cluster, key ed25519.PrivateKey, endpoints ...string) *Client {
	t.Helper()
	creds, _, err := TakeOwnership(ctx(t), f.Addr, key)
	if err != nil {
		t.Fatal(err)
	}
	c, err := Dial(&Config{Dir: t.TempDir(), Key: key, Credentials: creds, Curators: endpoints, NodeEndpoints: map[string]string{}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}

// TestClientFailover: UNAVAILABLE (a dead endpoint, or a curator that
// cannot serve) moves on to the next endpoint; other errors do not.
func TestClientFailover(t *testing.T) {
	ca := fakecluster.NewCA(t, "cluster")
	key := fakecluster.NewKey(t)
	good := fakecluster.New(t, fakecluster.Config{CA: ca, OwnerKey: key})
	busy := fakecluster.New(t, fakecluster.Config{CA: ca, OwnerKey: key})
	busy.SetOwnerCallError(status.Error(codes.Unavailable, "not the leader"))
	dead, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	deadAddr := dead.Addr().String()
	dead.Close()

	// Accepts connections and never answers.
	mute, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer mute.Close()
	go func() {
		for {
			c, err := mute.Accept()
			if err != nil {
				return
			}
			defer c.Close()
		}
	}()
	old := connectTimeout
	connectTimeout = 500 * time.Millisecond
	t.Cleanup(func() { connectTimeout = old })

	c := ownerClient(t, good, key, deadAddr, mute.Addr().String(), busy.Addr, good.Addr)
	nodes, err := c.Nodes(ctx(t))
	if err != nil {
		t.Fatal(err)
	}
	if len(nodes) != 2 || nodes[0].GetId() != good.Node.ID() {
		t.Fatalf("nodes %v", nodes)
	}
	if busy.OwnerCalls() != 1 {
		t.Errorf("busy curator called %d times, want 1", busy.OwnerCalls())
	}
	// The endpoint that answered is asked first from then on.
	n, err := c.FindNode(ctx(t), strings.Repeat("aa", 32))
	if err != nil || n.GetState() != clusterpb.NodeState_NODE_STATE_NEW {
		t.Fatalf("find by key: %v, %v", n, err)
	}
	if err := c.Approve(ctx(t), n.GetPublicKey()); err != nil {
		t.Fatal(err)
	}
	if approved := good.Approved(); busy.OwnerCalls() != 1 || len(approved) != 1 || !bytes.Equal(approved[0], n.GetPublicKey()) {
		t.Errorf("busy calls %d, approved %x", busy.OwnerCalls(), approved)
	}
	r, err := c.RegisterParameters(ctx(t))
	if err != nil {
		t.Fatal(err)
	}
	if string(r.GetRegisterTicket()) != fakecluster.FirstTicket || !bytes.Equal(r.GetClusterCaCertificate(), ca.Certificate.Raw) ||
		!slices.Equal(r.GetCuratorEndpoints(), []string{"10.42.0.10:7835"}) {
		t.Errorf("register parameters %v", r)
	}

	// PermissionDenied is an answer, not an outage: no failover.
	denied := fakecluster.New(t, fakecluster.Config{CA: ca, OwnerKey: key})
	denied.SetOwnerCallError(status.Error(codes.PermissionDenied, "no"))
	c2 := ownerClient(t, good, key, denied.Addr, good.Addr)
	if _, err := c2.Nodes(ctx(t)); status.Code(err) != codes.PermissionDenied {
		t.Errorf("got %v, want PermissionDenied from the first endpoint", err)
	}

	// Nothing answers: UNAVAILABLE naming every endpoint.
	c3 := ownerClient(t, good, key, deadAddr, busy.Addr)
	if _, err := c3.Ticket(ctx(t)); status.Code(err) != codes.Unavailable || !strings.Contains(err.Error(), deadAddr) || !strings.Contains(err.Error(), "not the leader") {
		t.Errorf("all endpoints down: %v", err)
	}
}

// TestNodeManagementChecksNode: NodeManagement calls go to the endpoint
// override and only to a server holding that node's certificate.
func TestNodeManagementChecksNode(t *testing.T) {
	ca := fakecluster.NewCA(t, "cluster")
	key := fakecluster.NewKey(t)
	f := fakecluster.New(t, fakecluster.Config{CA: ca, OwnerKey: key})
	c := ownerClient(t, f, key, f.Addr)
	c.SetNodeEndpoint(f.Node.ID(), f.NodeAddr)
	var got []string
	err := c.Logs(ctx(t), f.Node.ID(), &clusterpb.LogsRequest{Dn: "root.x"}, func(e *clusterpb.LogEntry) error {
		got = append(got, e.GetDn()+":"+e.GetMessage())
		return nil
	})
	if err != nil || !slices.Equal(got, []string{"root.x:hello", "root.x:world"}) {
		t.Fatalf("logs %v, %v", got, err)
	}
	// An override pointing at another node's server is caught by the TLS check.
	c.SetNodeEndpoint("plinth-00000000000000aa", f.NodeAddr)
	err = c.Logs(ctx(t), "plinth-00000000000000aa", &clusterpb.LogsRequest{}, func(*clusterpb.LogEntry) error { return nil })
	if err == nil || !strings.Contains(err.Error(), "reached node "+f.Node.ID()) {
		t.Errorf("logs from the wrong node: %v", err)
	}
}

// TestTakeOwnershipUnavailable: a curator that is not up yet (through a
// vmtest router: the connection is accepted and closed at once) is
// UNAVAILABLE, which LaunchCluster retries on.
func TestTakeOwnershipUnavailable(t *testing.T) {
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer lis.Close()
	go func() {
		for {
			c, err := lis.Accept()
			if err != nil {
				return
			}
			c.Close()
		}
	}()
	_, _, err = TakeOwnership(ctx(t), lis.Addr().String(), fakecluster.NewKey(t))
	if status.Code(err) != codes.Unavailable {
		t.Errorf("got %v (%v), want Unavailable", status.Code(err), err)
	}
}
