//go:build built

package vmtest

import (
	"context"
	"encoding/base64"
	"fmt"
	"maps"
	"os"
	"path/filepath"
	"regexp"
	"runtime"
	"slices"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"

	"plinth.dev/plinth/api/clusterpb"
	"plinth.dev/plinth/image"
	"plinth.dev/plinth/internal/testutil/ocitest"
	"plinth.dev/plinth/launch"
)

// Pulls from a registry (issue: real workloads), checked in
// TestKubernetesTwoNodes: the harness's registry (registry.go) holds the
// test image, which no node has under these names, and the cluster policy
// says how to reach it, set with plinthctl cluster policy as an owner would,
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
func startPullRegistry(t *testing.T) (*launch.Registry, string) {
	t.Helper()
	reg, err := launch.StartRegistry(launch.DefaultSubnet, launch.ProxyCommand)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { reg.Close() })
	img, err := image.TestPodImage(testpodProgram(t), runtime.GOARCH)
	if err != nil {
		t.Fatal(err)
	}
	// Not the image the nodes carry: another config, so another image
	// ID. (The same image would also meet the kubelet's check of images
	// pulled with credentials (KEP-2535): once pull-digest had pulled it
	// with them, the node's own plinth.dev/testpod:v1, the same image,
	// was "not present" to pods with imagePullPolicy Never.)
	if img, err = ocitest.Labelled(img, "dev.plinth.vmtest", "pulled from the harness's registry"); err != nil {
		t.Fatal(err)
	}
	d, err := reg.Push(pullRepo, "v1", img)
	if err != nil {
		t.Fatal(err)
	}
	return reg, d.String()
}

// setPullPolicy puts the registry into the cluster policy with plinthctl.
func setPullPolicy(t *testing.T, ctx context.Context, c *launch.Cluster, ctl plinthctl, reg *launch.Registry) {
	t.Helper()
	dir := t.TempDir()
	ca, right, wrong := filepath.Join(dir, "ca.pem"), filepath.Join(dir, "right"), filepath.Join(dir, "wrong")
	for f, b := range map[string]string{ca: string(reg.CAPEM), right: reg.Password + "\n", wrong: "not-" + reg.Password + "\n"} {
		if err := os.WriteFile(f, []byte(b), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	for _, args := range [][]string{
		{"--registry", "registry.invalid", "--mirror", "https://" + reg.MirrorHost(), "--registry-ca", ca},
		// The conformance smoke's images (smoke_test.go).
		{"--registry", "registry.k8s.io", "--mirror", "https://" + reg.MirrorHost(), "--registry-ca", ca},
		{"--registry", reg.AuthHost(), "--registry-ca", ca, "--registry-username", reg.Username, "--registry-password-file", right},
		{"--registry", reg.OtherAuthHost(), "--registry-ca", ca, "--registry-username", reg.Username, "--registry-password-file", wrong},
	} {
		out, err := ctl.output(ctx, append([]string{"cluster", "policy", "--config", c.OwnerDir()}, args...)...)
		if err != nil {
			t.Fatalf("plinthctl cluster policy %s: %v\n%s", strings.Join(args, " "), err, out)
		}
		if strings.Contains(out, reg.Password) {
			t.Fatalf("plinthctl cluster policy printed the password:\n%s", out)
		}
	}
}

// imagePod is a pod of image on node, serving HTTP as the test image
// does, with the pull policy given.
func imagePod(name, node, image, pullPolicy string) string {
	return `apiVersion: v1
kind: Pod
metadata: {name: ` + name + `}
spec:
  nodeSelector: {kubernetes.io/hostname: ` + node + `}
  ` + strings.ReplaceAll(outlastOutages, "\n", "\n  ") + `
  containers:
  - name: web
    image: ` + image + `
    imagePullPolicy: ` + pullPolicy + `
    args: [serve]
`
}

// mirroredRef is the test image by tag in the registry that exists only
// as a mirror.
const mirroredRef = "registry.invalid/" + pullRepo + ":v1"

// pullPods are the pods of the pull checks: the pull through the
// mirror on the worker (which then reboots: pulledAfterReboot), the
// others on the controller; and, in namespace pull-a, the one pulling
// with its own Secret's credentials (pull-secret), whose image a pod of
// namespace pull-b then tries to use (checkPullSecretImage).
func pullPods(reg *launch.Registry, digest, controller, worker string) []string {
	auth := base64.StdEncoding.EncodeToString([]byte(reg.Username + ":" + reg.Password))
	secret := fmt.Sprintf(`{"auths":{%q:{"username":%q,"password":%q,"auth":%q}}}`, reg.OtherAuthHost(), reg.Username, reg.Password, auth)
	return []string{
		imagePod("pull-tag", worker, mirroredRef, "Always"),
		imagePod("pull-digest", controller, reg.AuthHost()+"/"+pullRepo+"@"+digest, "Always"),
		imagePod("pull-refused", controller, reg.OtherAuthHost()+"/"+pullRepo+":v1", "Always"),
		"apiVersion: v1\nkind: Namespace\nmetadata: {name: pull-a}\n",
		"apiVersion: v1\nkind: Namespace\nmetadata: {name: pull-b}\n",
		`apiVersion: v1
kind: Secret
metadata: {name: regcred, namespace: pull-a}
type: kubernetes.io/dockerconfigjson
stringData: {.dockerconfigjson: '` + secret + `'}
`,
		strings.Replace(imagePod("pull-secret", controller, reg.OtherAuthHost()+"/"+pullRepo+":v1", "IfNotPresent"),
			"metadata: {name: pull-secret}", "metadata: {name: pull-secret, namespace: pull-a}", 1) + "  imagePullSecrets: [{name: regcred}]\n",
	}
}

// checkPullSecretImage: the kubelet's check of pulled images
// (KubeletEnsureSecretPulledImages) as a tenant of another namespace
// meets it: pull-secret pulled the image with its namespace's Secret
// (the cluster policy's credentials for that registry are wrong); a pod
// of namespace pull-b without that Secret, on the same node, with
// imagePullPolicy IfNotPresent, does not start from the node's copy: it
// must pull with its own credentials, and the registry refuses them.
func checkPullSecretImage(t *testing.T, ctx context.Context, k kubectl, reg *launch.Registry, controller string) {
	t.Helper()
	if out, err := k.wait(ctx, 10*time.Minute, "Ready", "-n", "pull-a", "pod/pull-secret"); err != nil {
		t.Fatalf("pod pull-secret (its own Secret's credentials) not Ready: %v\n%s\n%s", err, out, k.run(t, ctx, "describe", "-n", "pull-a", "pod", "pull-secret"))
	}
	k.apply(t, ctx, strings.Replace(imagePod("pull-borrow", controller, reg.OtherAuthHost()+"/"+pullRepo+":v1", "IfNotPresent"),
		"metadata: {name: pull-borrow}", "metadata: {name: pull-borrow, namespace: pull-b}", 1))
	k.until(t, ctx, 10*time.Minute, "pod pull-borrow (another namespace, no Secret) refused the image pulled with pull-a's Secret", func(out string) bool {
		reason, msg, _ := strings.Cut(out, "|")
		return (reason == "ErrImagePull" || reason == "ImagePullBackOff") && strings.Contains(msg, reg.OtherAuthHost())
	}, "get", "-n", "pull-b", "pod", "pull-borrow", "-o", `jsonpath={.status.containerStatuses[0].state.waiting.reason}|{.status.containerStatuses[0].state.waiting.message}`)
	k.run(t, ctx, "delete", "namespace", "pull-a", "pull-b", "--wait=false")
}

// checkPulls waits for the pulled pods to run, and for the refused one
// to say why.
func checkPulls(t *testing.T, ctx context.Context, k kubectl, reg *launch.Registry, controller string) {
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
	checkPullSecretImage(t, ctx, k, reg, controller)
	// The test's later steps run without them, as before.
	k.run(t, ctx, "delete", "pod", "pull-tag", "pull-digest", "pull-refused", "--wait=false")
}

// pulledAfterReboot stops the registry and creates, for the worker
// while its power is off, a pod of the image it pulled before
// (pull-tag's) and one that must pull it again. The returned check
// waits, once the worker is back, for the first to run from the node's
// store and the second to wait in back-off saying why. Created before
// the boot, both start with the worker's other pods instead of after
// them.
func pulledAfterReboot(t *testing.T, ctx context.Context, k kubectl, reg *launch.Registry, worker string) (check func()) {
	t.Helper()
	reg.Close()
	k.apply(t, ctx, imagePod("pulled-before", worker, mirroredRef, "IfNotPresent"))
	k.apply(t, ctx, imagePod("pull-down", worker, mirroredRef, "Always"))
	return func() {
		t.Helper()
		if out, err := k.wait(ctx, 10*time.Minute, "Ready", "pod/pulled-before"); err != nil {
			t.Fatalf("the image pulled before the reboot does not start with the registry down: %v\n%s\n%s", err, out,
				k.run(t, ctx, "describe", "pod", "pulled-before"))
		}
		k.until(t, ctx, 10*time.Minute, "pod pull-down waits in back-off, saying why", func(out string) bool {
			reason, msg, _ := strings.Cut(out, "|")
			return (reason == "ErrImagePull" || reason == "ImagePullBackOff") && strings.Contains(msg, mirroredRef)
		}, "get", "pod", "pull-down", "-o", `jsonpath={.status.containerStatuses[0].state.waiting.reason}|{.status.containerStatuses[0].state.waiting.message}`)
		t.Logf("registry down: the image pulled before the reboot starts; a pull waits: %s",
			k.run(t, ctx, "get", "pod", "pull-down", "-o", `jsonpath={.status.containerStatuses[0].state.waiting.message}`))
		k.run(t, ctx, "delete", "pod", "pulled-before", "pull-down", "--wait=false")
	}
}

// userImagePods are pods, on node, of each user image next carries
// (plinthctl build --oci-archive; make puts the archive of
// internal/testutil/cmd/userimage in it), with imagePullPolicy Never:
// refs by pod name, and the manifests. Applied once the node runs next
// (with the pods its update's check applies: they start side by side),
// checkUserImages waits for them.
func userImagePods(t *testing.T, next *launch.Image, node string) (refs map[string]string, manifests []string) {
	t.Helper()
	refs = map[string]string{}
	for _, img := range next.Manifest.ContainerImages {
		if strings.HasPrefix(filepath.Base(img.Archive), "user-") {
			name := fmt.Sprintf("user-image-%d", len(refs))
			refs[name] = img.Ref
			manifests = append(manifests, imagePod(name, node, img.Ref, "Never"))
		}
	}
	if len(refs) == 0 {
		t.Fatalf("the next image carries no user image (make builds it with plinthctl build --oci-archive): %v", next.Manifest.ContainerImages)
	}
	return refs, manifests
}

// checkUserImages checks that the pods of userImagePods (refs) run on
// node n, updated to the image that carries their images: the node
// imported them at its boot into it, and pinned them.
func checkUserImages(t *testing.T, ctx context.Context, c *launch.Cluster, ctl plinthctl, k kubectl, n *launch.ClusterNode, refs map[string]string) {
	t.Helper()
	for _, p := range slices.Sorted(maps.Keys(refs)) {
		if out, err := k.wait(ctx, 10*time.Minute, "Ready", "pod/"+p); err != nil {
			t.Errorf("pod %s of the user image %s (imagePullPolicy Never) not Ready: %v\n%s\n%s", p, refs[p], err, out, k.run(t, ctx, "describe", "pod", p))
		}
	}
	out := ctl.run(t, "node", "logs", "--config", c.OwnerDir(), "--dn", "root.roleserver.kubernetes.worker.images", n.ID())
	for _, ref := range refs {
		if !regexp.MustCompile(`(imported|present) ` + regexp.QuoteMeta(ref) + ` \(sha256:[0-9a-f]+\), pinned`).MatchString(out) {
			t.Errorf("%s does not say it imported and pinned the user image %s:\n%s", n.Name, ref, out)
		}
	}
	t.Logf("user images carried by the next image run on %s without a registry: %s", n.Name, strings.Join(slices.Sorted(maps.Values(refs)), ", "))
}

// refuseMalformedRegistry sends the curator, as the owner, policies with
// a malformed registry entry (the requests plinthctl would refuse
// itself, sent past it): each is refused with InvalidArgument and the
// stored policy stays as it was. The pulls after it run on that policy,
// so the nodes kept the last good configuration.
func refuseMalformedRegistry(t *testing.T, ctx context.Context, c *launch.Cluster) {
	t.Helper()
	info, err := c.Client().ClusterInfo(ctx)
	if err != nil {
		t.Fatal(err)
	}
	good := info.GetConfiguration().GetKubernetes()
	if len(good.GetImageRegistries()) == 0 {
		t.Fatal("the cluster policy has no registries: setPullPolicy first")
	}
	for what, spoil := range map[string]func(*clusterpb.ImageRegistry){
		"a mirror that is no URL": func(r *clusterpb.ImageRegistry) { r.Mirrors = []string{"ftp://mirror with spaces"} },
		"a CA that is no PEM": func(r *clusterpb.ImageRegistry) {
			r.CaCertificates = "-----BEGIN CERTIFICATE-----\nnot base64\n-----END CERTIFICATE-----\n"
		},
		"a host with a path": func(r *clusterpb.ImageRegistry) { r.Host = "registry.example.com/path" },
	} {
		k := proto.Clone(good).(*clusterpb.KubernetesPolicy)
		spoil(k.ImageRegistries[0])
		_, err := c.Client().UpdatePolicy(ctx, &clusterpb.UpdateClusterPolicyRequest{Kubernetes: k})
		if status.Code(err) != codes.InvalidArgument {
			t.Errorf("the curator took a policy with %s: %v", what, err)
		}
	}
	info, err = c.Client().ClusterInfo(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if now := info.GetConfiguration().GetKubernetes(); !proto.Equal(now, good) {
		t.Errorf("the refused policies changed the stored one:\n%v\nwas\n%v", now, good)
	}
}
