package vmtest

import (
	"context"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"testing"
	"time"

	"github.com/google/go-containerregistry/pkg/v1/mutate"

	"plinth.dev/plinth/image"
)

// Pulls from a registry (issue: real workloads), checked in
// TestKubernetesTwoNodes: the harness's registry (registry.go) holds the
// test image, which no node has under these names, and the cluster policy
// says how to reach it, set with plinthctl policy as an owner would,
// before the kubelets start:
//
//	registry.invalid      no such host: mirror https://<MirrorHost> (anonymous), its CA
//	<AuthHost>            its CA, the right credentials (through the kubelet's credential provider)
//	<OtherAuthHost>       its CA, a wrong password
//
// A pod by tag through the mirror and a pod by digest with credentials
// run; a pod of the registry with the wrong password is refused the pull,
// and its status names the registry.

// pullRepo is the repository the registry serves the test image under.
const pullRepo = "plinth/testpod"

// startPullRegistry starts the registry with the test image as
// pullRepo:v1 and returns its digest.
func startPullRegistry(t *testing.T) (*Registry, string) {
	t.Helper()
	reg, err := StartRegistry(DefaultSubnet, proxyCommand)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { reg.Close() })
	bin, err := FromEnv("PLINTH_TESTPOD", "bin/testpod")
	if err != nil {
		t.Fatal(err)
	}
	testpod, err := os.ReadFile(bin)
	if err != nil {
		t.Fatalf("the test image's program: %v (make builds it)", err)
	}
	img, err := image.TestPodImage(testpod, runtime.GOARCH)
	if err != nil {
		t.Fatal(err)
	}
	// Not the image the nodes carry: another config, so another image
	// ID. (The same image would also meet the kubelet's check of images
	// pulled with credentials (KEP-2535): once pull-digest had pulled it
	// with them, the node's own plinth.dev/testpod:v1, the same image,
	// was "not present" to pods with imagePullPolicy Never.)
	cfg, err := img.ConfigFile()
	if err != nil {
		t.Fatal(err)
	}
	c := cfg.Config.DeepCopy()
	c.Labels = map[string]string{"dev.plinth.vmtest": "pulled from the harness's registry"}
	if img, err = mutate.Config(img, *c); err != nil {
		t.Fatal(err)
	}
	d, err := reg.Push(pullRepo, "v1", img)
	if err != nil {
		t.Fatal(err)
	}
	return reg, d.String()
}

// setPullPolicy puts the registry into the cluster policy with plinthctl.
func setPullPolicy(t *testing.T, ctx context.Context, c *Cluster, ctl plinthctl, reg *Registry) {
	t.Helper()
	dir := t.TempDir()
	ca, right, wrong := filepath.Join(dir, "ca.pem"), filepath.Join(dir, "right"), filepath.Join(dir, "wrong")
	for f, b := range map[string]string{ca: string(reg.CAPEM), right: reg.Password + "\n", wrong: "not-" + reg.Password + "\n"} {
		if err := os.WriteFile(f, []byte(b), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	for _, args := range [][]string{
		{"-registry", "registry.invalid", "-mirror", "https://" + reg.MirrorHost(), "-registry-ca", ca},
		{"-registry", reg.AuthHost(), "-registry-ca", ca, "-registry-username", reg.Username, "-registry-password-file", right},
		{"-registry", reg.OtherAuthHost(), "-registry-ca", ca, "-registry-username", reg.Username, "-registry-password-file", wrong},
	} {
		out, err := ctl.output(ctx, append([]string{"policy", "-config", c.OwnerDir()}, args...)...)
		if err != nil {
			t.Fatalf("plinthctl policy %s: %v\n%s", strings.Join(args, " "), err, out)
		}
		if strings.Contains(out, reg.Password) {
			t.Fatalf("plinthctl policy printed the password:\n%s", out)
		}
	}
}

// pulledPod is a pod of image on node, pulled (never in the node's store
// under that name).
func pulledPod(name, node, image string) string {
	return `apiVersion: v1
kind: Pod
metadata: {name: ` + name + `}
spec:
  nodeSelector: {kubernetes.io/hostname: ` + node + `}
  ` + strings.ReplaceAll(outlastOutages, "\n", "\n  ") + `
  containers:
  - name: web
    image: ` + image + `
    imagePullPolicy: Always
    args: [serve]
`
}

// pullPods are the three pods of the pull checks, on node.
func pullPods(reg *Registry, digest, node string) []string {
	return []string{
		pulledPod("pull-tag", node, "registry.invalid/"+pullRepo+":v1"),
		pulledPod("pull-digest", node, reg.AuthHost()+"/"+pullRepo+"@"+digest),
		pulledPod("pull-refused", node, reg.OtherAuthHost()+"/"+pullRepo+":v1"),
	}
}

// checkPulls waits for the pulled pods to run, and for the refused one
// to say why.
func checkPulls(t *testing.T, ctx context.Context, k kubectl, reg *Registry) {
	t.Helper()
	for _, p := range []string{"pull-tag", "pull-digest"} {
		if out, err := k.wait(ctx, 10*time.Minute, "Ready", "pod/"+p); err != nil {
			t.Fatalf("pod %s (pulled from the registry) not Ready: %v\n%s\n%s", p, err, out,
				k.run(t, ctx, "describe", "pod", p))
		}
	}
	k.until(t, ctx, 10*time.Minute, "pod pull-refused refused its pull, naming the registry", func(out string) bool {
		reason, msg, _ := strings.Cut(out, "|")
		return (reason == "ErrImagePull" || reason == "ImagePullBackOff") && strings.Contains(msg, reg.OtherAuthHost())
	}, "get", "pod", "pull-refused", "-o", `jsonpath={.status.containerStatuses[0].state.waiting.reason}|{.status.containerStatuses[0].state.waiting.message}`)
	// Refused for its credentials (the registry's 401), not for TLS or
	// the network: the same registry served pull-digest.
	k.until(t, ctx, 5*time.Minute, "pull-refused's events name the registry's 401", func(out string) bool {
		return strings.Contains(out, reg.OtherAuthHost()) && strings.Contains(out, "401 Unauthorized")
	}, "get", "events", "--field-selector", "involvedObject.name=pull-refused", "-o", "jsonpath={.items[*].message}")
	t.Logf("pulled from the harness's registry: by tag through a mirror, by digest with credentials; a wrong password refused")
	// The test's later steps run without them, as before.
	k.run(t, ctx, "delete", "pod", "pull-tag", "pull-digest", "pull-refused", "--wait=false")
}
