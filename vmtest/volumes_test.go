//go:build built

package vmtest

import (
	"context"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"plinth.dev/plinth/launch"
	"plinth.dev/plinth/platform/layout"
	"plinth.dev/plinth/platform/volumefs"
)

// volumeSize is the claims' size in the volume checks: their own
// filesystems' (with their metadata: volumefs.ImageSize).
const (
	volumeSize  = "16Mi"
	volumeBytes = 16 << 20
)

// volumeWorkloads are the local volume checks' workloads, on the
// worker: a StatefulSet "db" whose pod keeps a file in its claim of the
// default StorageClass, and a pod "scratch" with a claim of its own, to
// be deleted.
func volumeWorkloads(worker string) []string {
	placement := "nodeSelector: {kubernetes.io/hostname: " + worker + "}\n" + outlastOutages
	indent := func(s, by string) string { return strings.ReplaceAll(s, "\n", "\n"+by) }
	return []string{`apiVersion: apps/v1
kind: StatefulSet
metadata: {name: db}
spec:
  replicas: 1
  selector: {matchLabels: {app: db}}
  serviceName: db
  template:
    metadata: {labels: {app: db}}
    spec:
      ` + indent(placement, "      ") + `
      containers:
      - name: db
        image: ` + layout.TestImage + `
        imagePullPolicy: Never
        args: [serve]
        volumeMounts: [{name: data, mountPath: /data}]
  volumeClaimTemplates:
  - metadata: {name: data}
    spec:
      accessModes: [ReadWriteOnce]
      resources: {requests: {storage: ` + volumeSize + `}}
`, `apiVersion: v1
kind: PersistentVolumeClaim
metadata: {name: scratch}
spec:
  accessModes: [ReadWriteOncePod]
  resources: {requests: {storage: ` + volumeSize + `}}
---
apiVersion: v1
kind: Pod
metadata: {name: scratch}
spec:
  ` + indent(placement, "  ") + `
  containers:
  - name: scratch
    image: ` + layout.TestImage + `
    imagePullPolicy: Never
    args: [serve]
    volumeMounts: [{name: data, mountPath: /data}]
  volumes: [{name: data, persistentVolumeClaim: {claimName: scratch}}]
`}
}

// keptText is what db's pod keeps in its volume.
const keptText = "kept across restarts"

// checkVolumes: the claims of the default StorageClass are bound to
// volumes the worker's provisioner made in its local volumes directory,
// on the worker alone; a pod that writes past its claim's size, its
// file's project ID reset first, is stopped by the volume's own
// filesystem (ENOSPC) while the node stays HEALTHY, its containerd
// serves and etcd keeps writing; a file kept in the volume is there for the
// StatefulSet's new pod after a pod delete; a deleted claim's volume
// goes with its data.
func checkVolumes(t *testing.T, ctx context.Context, c *launch.Cluster, ctl plinthctl, k kubectl, worker *launch.ClusterNode) {
	t.Helper()
	if out, err := k.wait(ctx, 10*time.Minute, "Ready", "pod/db-0", "pod/scratch"); err != nil {
		t.Fatalf("the pods with volumes not Ready: %v\n%s\n%s\n%s", err, out, k.run(t, ctx, "describe", "pvc"), k.run(t, ctx, "describe", "pod", "db-0", "scratch"))
	}
	for _, claim := range []string{"data-db-0", "scratch"} {
		pv := strings.TrimSpace(k.run(t, ctx, "get", "pvc", claim, "-o", "jsonpath={.spec.volumeName}"))
		out := k.run(t, ctx, "get", "pv", pv, "-o", `jsonpath={.spec.local.path}|{.spec.nodeAffinity.required.nodeSelectorTerms[0].matchExpressions[0].values}|{.spec.storageClassName}|{.spec.capacity.storage}|{.spec.persistentVolumeReclaimPolicy}`)
		if want := layout.LocalVolumesDir + "/" + pv + `|["` + worker.ID() + `"]|local|` + volumeSize + "|Delete"; out != want {
			t.Fatalf("claim %s's volume %s: %q, want %q", claim, pv, out, want)
		}
	}
	k.run(t, ctx, "exec", "db-0", "--", "/testpod", "write", "/data/keep", keptText)
	// Past the claim's size: the write stops at the volume's own
	// filesystem (its image: the claim and the filesystem's metadata),
	// though the file left any project quota first (`chattr -p 0`, as
	// its owner may) and asks for 200 MiB.
	t.Log(k.run(t, ctx, "exec", "db-0", "--", "/testpod", "setproject", "/data/fill", "0"))
	out, err := k.try(ctx, "exec", "db-0", "--", "/testpod", "fill", "/data/fill", strconv.Itoa(200<<20))
	m := regexp.MustCompile(`wrote (\d+) bytes, then: .* \((EDQUOT|ENOSPC)\)`).FindStringSubmatch(out)
	if err == nil || m == nil {
		t.Fatalf("writing 200 MiB into a volume of %d: %v\n%s", volumeBytes, err, out)
	}
	if n, _ := strconv.Atoi(m[1]); int64(n) > volumefs.ImageSize(volumeBytes) {
		t.Fatalf("wrote %d bytes into a volume of %d (image %d) before %s", n, volumeBytes, volumefs.ImageSize(volumeBytes), m[2])
	}
	t.Logf("a write past the volume's size, its file out of every project: %s", strings.TrimSpace(out))
	// etcd keeps writing: the API server stores an object.
	k.run(t, ctx, "create", "configmap", "after-the-fill", "--from-literal=written=yes")
	k.run(t, ctx, "delete", "configmap", "after-the-fill")
	// The node is unharmed: HEALTHY, and its containerd runs a command.
	if _, err := c.WaitNode(ctx, worker, "HEALTHY", launch.UpAndHealthy); err != nil {
		t.Fatal(err)
	}
	k.run(t, ctx, "exec", "db-0", "--", "/testpod", "fill", "/data/fill", "0")
	// The StatefulSet's next pod has the file; a deleted claim's volume
	// goes, with its data.
	pv := strings.TrimSpace(k.run(t, ctx, "get", "pvc", "scratch", "-o", "jsonpath={.spec.volumeName}"))
	k.remove(t, ctx, 5*time.Minute, "pod/db-0", "pod/scratch", "pvc/scratch")
	readKept(t, ctx, k, "after the pod's delete")
	k.until(t, ctx, 5*time.Minute, "the deleted claim's volume "+pv+" is deleted", func(out string) bool { return !strings.Contains(out, pv) },
		"get", "pv", "-o", "name")
	logs := ctl.run(t, "node", "logs", "--config", c.OwnerDir(), "--dn", "root.roleserver.kubernetes.worker.volumes", worker.ID())
	if !strings.Contains(logs, "volume "+pv+": released by default/scratch, deleted with its data") {
		t.Errorf("the worker's provisioner does not say it deleted %s with its data:\n%s", pv, logs)
	}
}

// readKept waits for db's pod to read the file it kept in its volume.
func readKept(t *testing.T, ctx context.Context, k kubectl, when string) {
	t.Helper()
	k.until(t, ctx, 10*time.Minute, "db-0 reads its volume's file "+when, func(out string) bool { return out == keptText },
		"exec", "db-0", "--", "/testpod", "cat", "/data/keep")
}
