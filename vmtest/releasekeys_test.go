//go:build built

package vmtest

import (
	"context"
	"crypto/ed25519"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"plinth.dev/plinth/api/clusterpb"
	"plinth.dev/plinth/launch"
	"plinth.dev/plinth/platform/pki"
	"plinth.dev/plinth/platform/releasekeys"
)

// releaseKey is a release key plinthctl release key made: its private
// key file and the key.
type releaseKey struct {
	file string
	key  ed25519.PrivateKey
}

// newReleaseKey makes a release key in dir as the owner would.
func newReleaseKey(t *testing.T, ctl plinthctl, dir, name string) releaseKey {
	t.Helper()
	file := filepath.Join(dir, name)
	ctl.run(t, "release", "key", file)
	b, err := os.ReadFile(file)
	if err != nil {
		t.Fatal(err)
	}
	k, err := pki.ParsePrivateKeyPEM(b)
	if err != nil {
		t.Fatal(err)
	}
	return releaseKey{file: file, key: k}
}

// releaseKeyChange attacks the release keys as a thief of the owner's
// files would (the owner's certificate, no release key): plinthctl
// refuses to add a key without a current key's signature, and the
// curator refuses a key set signed by the new key alone, sent straight
// with the owner's client. Then the owner adds K2 with the development
// release key's signature (and K2's); the node takes it when an image
// signed by K2 comes (TestUpdate's halting image). It returns K2.
func releaseKeyChange(t *testing.T, ctx context.Context, c *launch.Cluster, ctl plinthctl, dir string) releaseKey {
	t.Helper()
	k2 := newReleaseKey(t, ctl, dir, "k2.key")
	if out, err := exec.CommandContext(ctx, string(ctl), "cluster", "policy", "--config", c.OwnerDir(), "--add-release-key", k2.file).CombinedOutput(); err == nil ||
		!strings.Contains(string(out), "--sign-key") {
		t.Fatalf("plinthctl cluster policy --add-release-key without --sign-key: %v\n%s", err, out)
	}
	cfg, err := c.Client().ClusterInfo(ctx)
	if err != nil {
		t.Fatal(err)
	}
	chain := cfg.GetConfiguration().ReleaseKeyChainSigned()
	if len(chain) != 1 {
		t.Fatalf("the cluster's release key chain has %d versions; want the bootstrap image's genesis", len(chain))
	}
	body, err := releasekeys.NextKeySet(&chain[0], append(cfg.GetConfiguration().GetReleaseKeys(), k2.key.Public().(ed25519.PublicKey)))
	if err != nil {
		t.Fatal(err)
	}
	_, err = c.Client().UpdatePolicy(ctx, &clusterpb.UpdateClusterPolicyRequest{ReleaseKeys: clusterpb.NewSignedStatement(releasekeys.Sign(body, k2.key))})
	if status.Code(err) != codes.FailedPrecondition || !strings.Contains(err.Error(), "not signed by a key of the set before") {
		t.Fatalf("a key set signed by the new key alone, sent to the curator: %v; want FailedPrecondition", err)
	}
	t.Log(ctl.run(t, "cluster", "policy", "--config", c.OwnerDir(), "--add-release-key", k2.file, "--sign-key", builtPath(t, "PLINTH_RELEASE_KEY", "release.key")))
	return k2
}

// refusedDowngrades: the downgrade to halting (an older release) is
// refused by node n without a downgrade statement, and with one signed
// by a key the cluster does not have, before anything is sent.
func refusedDowngrades(t *testing.T, ctx context.Context, c *launch.Cluster, n *launch.ClusterNode, ctl plinthctl, halting, dir string) {
	t.Helper()
	other := newReleaseKey(t, ctl, dir, "other.key")
	for _, r := range []struct {
		args []string
		want string
	}{
		{nil, "no downgrade statement came with it"},
		{[]string{"--allow-downgrade", "--sign-key", other.file}, "the downgrade statement is not signed by any of the cluster's release keys"},
	} {
		out, err := exec.CommandContext(ctx, string(ctl), append([]string{"node", "update", "--config", c.OwnerDir(), n.ID(), "--image", halting}, r.args...)...).CombinedOutput()
		t.Logf("plinthctl node update %v:\n%s", r.args, out)
		if err == nil || !strings.Contains(string(out), "refused the image of version halting") || !strings.Contains(string(out), r.want) || strings.Contains(string(out), "sending ") {
			t.Fatalf("a downgrade %v: %v; want the node's refusal saying %q, nothing sent", r.args, err, r.want)
		}
	}
}
