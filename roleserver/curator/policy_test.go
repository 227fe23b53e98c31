package curator

import (
	"crypto/tls"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/protobuf/proto"

	"plinth.dev/plinth/api/clusterpb"
	"plinth.dev/plinth/roleserver/internal/testutil"
)

// TestWatchClusterPolicy: a worker's WatchClusterPolicy gets the policy
// at once and each change the owner makes (image registries with their
// credentials: a node needs them to pull); a malformed registry entry is
// refused with InvalidArgument, sends nothing and leaves the policy as it
// was; a caller without a cluster certificate gets nothing.
func TestWatchClusterPolicy(t *testing.T) {
	f := newSingle(t)
	a, ctx := f.a, f.ctx
	b, _ := f.worker("b")
	w, first := watchPolicy(t, a, b)
	if first.GetConfiguration() == nil || len(first.GetConfiguration().GetKubernetes().GetImageRegistries()) != 0 {
		t.Fatalf("first policy: %v", first)
	}

	regs := []*clusterpb.ImageRegistry{
		{Host: "registry.example.com", Mirrors: []string{"https://10.0.0.7:5000"}},
		{Host: "10.0.0.5:5000", Username: "puller", Password: "s3cret"},
	}
	mg := f.mgmt(a)
	mustOK(t, "UpdateClusterPolicy", second(mg.UpdateClusterPolicy(ctx, &clusterpb.UpdateClusterPolicyRequest{
		Kubernetes: &clusterpb.KubernetesPolicy{ImageRegistries: regs}})))
	ev, err := w.Recv()
	mustOK(t, "the changed policy", err)
	if got := ev.GetConfiguration().GetKubernetes().GetImageRegistries(); len(got) != 2 || !proto.Equal(got[0], regs[0]) || !proto.Equal(got[1], regs[1]) {
		t.Fatalf("registries on the watch: %v", got)
	}

	before, err := mg.GetClusterInfo(ctx, &clusterpb.GetClusterInfoRequest{})
	mustOK(t, "GetClusterInfo", err)
	for name, r := range map[string]*clusterpb.ImageRegistry{
		"a URL as host":             {Host: "https://registry.example.com"},
		"a mirror without a scheme": {Host: "r.example", Mirrors: []string{"mirror.example.com"}},
		"half credentials":          {Host: "r.example", Username: "u"},
		"a garbage CA":              {Host: "r.example", CaCertificates: "-----BEGIN CERTIFICATE-----\nnope\n-----END CERTIFICATE-----\n"},
	} {
		_, err := mg.UpdateClusterPolicy(ctx, &clusterpb.UpdateClusterPolicyRequest{
			Kubernetes: &clusterpb.KubernetesPolicy{ImageRegistries: append(regs[:1:1], r)}})
		wantCode(t, "a policy with "+name, err, codes.InvalidArgument, "image registry")
	}
	after, err := mg.GetClusterInfo(ctx, &clusterpb.GetClusterInfoRequest{})
	mustOK(t, "GetClusterInfo", err)
	if !proto.Equal(after.GetConfiguration(), before.GetConfiguration()) {
		t.Errorf("refused updates changed the policy: %v", after.GetConfiguration())
	}
	// Nothing was sent for them: the next event is the next good change.
	mustOK(t, "UpdateClusterPolicy", second(mg.UpdateClusterPolicy(ctx, &clusterpb.UpdateClusterPolicyRequest{
		Kubernetes: &clusterpb.KubernetesPolicy{ImageRegistries: regs[:1]}})))
	ev, err = w.Recv()
	mustOK(t, "the next policy", err)
	if got := ev.GetConfiguration().GetKubernetes().GetImageRegistries(); len(got) != 1 {
		t.Errorf("after the refused changes the watch sent %v", got)
	}

	anon := clusterpb.NewCuratorClient(testutil.Dial(t, a.addr(), credentials.NewTLS(&tls.Config{InsecureSkipVerify: true, MinVersion: tls.VersionTLS13})))
	s, err := anon.WatchClusterPolicy(ctx, &clusterpb.WatchClusterPolicyRequest{})
	if err == nil {
		_, err = s.Recv()
	}
	wantCode(t, "WatchClusterPolicy without a certificate", err, codes.Unauthenticated)
}

// TestWatchClusterPolicyAfterCompaction: once the compactor passed the
// revision the policy was last written at (minutes after it was set),
// a new WatchClusterPolicy gets the policy and the next change, not an
// error. Before, the watch started from that old revision and failed
// with Unavailable for ever: on a TCG cluster a worker rebooted after an
// update retried 270 times in two minutes, dropping its curator
// connection each time, and was late to become healthy.
func TestWatchClusterPolicyAfterCompaction(t *testing.T) {
	f := newSingle(t)
	a, ctx := f.a, f.ctx
	b, _ := f.worker("b")
	mg := f.mgmt(a)
	regs := []*clusterpb.ImageRegistry{{Host: "registry.example.com", Mirrors: []string{"https://10.0.0.7:5000"}}}
	mustOK(t, "UpdateClusterPolicy", second(mg.UpdateClusterPolicy(ctx, &clusterpb.UpdateClusterPolicyRequest{
		Kubernetes: &clusterpb.KubernetesPolicy{ImageRegistries: regs}})))
	kv, err := a.running(time.Minute).CuratorClient()
	mustOK(t, "CuratorClient", err)
	defer kv.Close()
	var rev int64
	for i := range 3 {
		resp, err := kv.Put(ctx, "/test/other", itoa(i))
		mustOK(t, "Put", err)
		rev = resp.Header.Revision
	}
	mustOK(t, "Compact", second(kv.Compact(ctx, rev)))

	w, first := watchPolicy(t, a, b)
	if got := first.GetConfiguration().GetKubernetes().GetImageRegistries(); len(got) != 1 {
		t.Fatalf("first policy after the compaction: %v", first)
	}
	mustOK(t, "UpdateClusterPolicy", second(mg.UpdateClusterPolicy(ctx, &clusterpb.UpdateClusterPolicyRequest{
		Kubernetes: &clusterpb.KubernetesPolicy{}})))
	ev, err := w.Recv()
	mustOK(t, "the policy changed after the compaction", err)
	if got := ev.GetConfiguration().GetKubernetes().GetImageRegistries(); len(got) != 0 {
		t.Errorf("registries on the watch: %v, want none", got)
	}
}

// watchPolicy opens node b's WatchClusterPolicy at a (for up to a
// minute) and returns it with its first event, the current policy.
func watchPolicy(t *testing.T, a, b *member) (clusterpb.Curator_WatchClusterPolicyClient, *clusterpb.WatchClusterPolicyEvent) {
	t.Helper()
	wctx, cancel := ctxTimeoutCancel(t, time.Minute)
	t.Cleanup(cancel)
	w, err := clusterpb.NewCuratorClient(withCreds(t, a.addr(), b.creds)).WatchClusterPolicy(wctx, &clusterpb.WatchClusterPolicyRequest{})
	mustOK(t, "WatchClusterPolicy", err)
	first, err := w.Recv()
	mustOK(t, "first policy", err)
	return w, first
}
