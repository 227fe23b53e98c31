package localvolumes

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	storagev1 "k8s.io/api/storage/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes/fake"
	"k8s.io/client-go/tools/record"

	"plinth.dev/plinth/platform/layout"
	"plinth.dev/plinth/platform/volumefs"
)

// fakeFS are the volumes' filesystems as plain directories and image
// files (the real ones, with loop devices and mounts, are
// platform/volumefs's and its test's), on a data volume of the size and
// free space the test says.
type fakeFS struct {
	mu          sync.Mutex
	total, free uint64
}

func (f *fakeFS) Make(_ context.Context, dir, image string, size int64) error {
	if err := os.MkdirAll(filepath.Dir(image), 0o700); err != nil {
		return err
	}
	if err := os.WriteFile(image, nil, 0o600); err != nil {
		return err
	}
	if err := os.Truncate(image, volumefs.ImageSize(size)); err != nil {
		return err
	}
	if err := os.Mkdir(dir, 0o777); err != nil && !errors.Is(err, os.ErrExist) {
		return err
	}
	return os.Chmod(dir, 0o777)
}

func (f *fakeFS) Remove(dir, image string) error {
	if err := os.RemoveAll(dir); err != nil {
		return err
	}
	if err := os.Remove(image); err != nil && !errors.Is(err, os.ErrNotExist) {
		return err
	}
	return nil
}

func (f *fakeFS) ImageSize(size int64) int64 { return volumefs.ImageSize(size) }

func (f *fakeFS) Space(string) (uint64, uint64, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.total, f.free, nil
}

func (f *fakeFS) setFree(n uint64) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.free = n
}

type fixture struct {
	t      *testing.T
	ctx    context.Context
	client *fake.Clientset
	fs     *fakeFS
	events *record.FakeRecorder
	dir    string
	images string
}

func start(t *testing.T) *fixture {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	del := corev1.PersistentVolumeReclaimDelete
	retain := corev1.PersistentVolumeReclaimRetain
	wffc := storagev1.VolumeBindingWaitForFirstConsumer
	base := t.TempDir()
	f := &fixture{t: t, ctx: ctx, fs: &fakeFS{total: 100 << 30, free: 90 << 30}, events: record.NewFakeRecorder(100),
		dir: filepath.Join(base, "volumes"), images: filepath.Join(base, "images"),
		client: fake.NewClientset(
			&storagev1.StorageClass{ObjectMeta: metav1.ObjectMeta{Name: "local"}, Provisioner: layout.LocalVolumesProvisioner,
				ReclaimPolicy: &del, VolumeBindingMode: &wffc},
			&storagev1.StorageClass{ObjectMeta: metav1.ObjectMeta{Name: "local-retain"}, Provisioner: layout.LocalVolumesProvisioner,
				ReclaimPolicy: &retain, VolumeBindingMode: &wffc},
			&storagev1.StorageClass{ObjectMeta: metav1.ObjectMeta{Name: "other"}, Provisioner: "example.com/other"},
		)}
	p := &Provisioner{Client: f.client, Node: "n1", Dir: f.dir, Images: f.images, FS: f.fs, Events: f.events, Log: t.Logf}
	done := make(chan error, 1)
	go func() { done <- p.Run(ctx) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; !errors.Is(err, context.Canceled) {
			t.Errorf("Run: %v", err)
		}
	})
	return f
}

// claim creates a Pending claim of class, size and mode, scheduled to
// node.
func (f *fixture) claim(name, class, node, size string, mode corev1.PersistentVolumeAccessMode) *corev1.PersistentVolumeClaim {
	f.t.Helper()
	c := &corev1.PersistentVolumeClaim{
		ObjectMeta: metav1.ObjectMeta{Namespace: "app", Name: name, UID: types.UID("uid-" + name),
			Annotations: map[string]string{AnnSelectedNode: node}},
		Spec: corev1.PersistentVolumeClaimSpec{StorageClassName: &class, AccessModes: []corev1.PersistentVolumeAccessMode{mode},
			Resources: corev1.VolumeResourceRequirements{Requests: corev1.ResourceList{corev1.ResourceStorage: resource.MustParse(size)}}},
		Status: corev1.PersistentVolumeClaimStatus{Phase: corev1.ClaimPending},
	}
	c, err := f.client.CoreV1().PersistentVolumeClaims("app").Create(f.ctx, c, metav1.CreateOptions{})
	if err != nil {
		f.t.Fatal(err)
	}
	return c
}

// volume waits for the PersistentVolume name (or its absence: gone).
func (f *fixture) volume(name string, gone bool) *corev1.PersistentVolume {
	f.t.Helper()
	for deadline := time.Now().Add(20 * time.Second); ; time.Sleep(20 * time.Millisecond) {
		v, err := f.client.CoreV1().PersistentVolumes().Get(f.ctx, name, metav1.GetOptions{})
		if gone && apierrors.IsNotFound(err) {
			return nil
		}
		if !gone && err == nil {
			return v
		}
		if time.Now().After(deadline) {
			f.t.Fatalf("volume %s: %v, %v; want gone=%v", name, v, err, gone)
		}
	}
}

// event waits for an event that holds every one of want.
func (f *fixture) event(want ...string) {
	f.t.Helper()
	timeout := time.After(20 * time.Second)
	for {
		select {
		case e := <-f.events.Events:
			ok := true
			for _, w := range want {
				ok = ok && strings.Contains(e, w)
			}
			if ok {
				return
			}
		case <-timeout:
			f.t.Fatalf("no event with %q", want)
		}
	}
}

// noVolume checks, after the provisioner has seen later work, that
// claim c has no volume.
func (f *fixture) noVolume(c *corev1.PersistentVolumeClaim) {
	f.t.Helper()
	if _, err := f.client.CoreV1().PersistentVolumes().Get(f.ctx, "pvc-"+string(c.UID), metav1.GetOptions{}); !apierrors.IsNotFound(err) {
		f.t.Errorf("claim %s has a volume: %v", c.Name, err)
	}
	if _, err := os.Stat(filepath.Join(f.dir, "pvc-"+string(c.UID))); !errors.Is(err, os.ErrNotExist) {
		f.t.Errorf("claim %s has a directory: %v", c.Name, err)
	}
}

func (f *fixture) release(v *corev1.PersistentVolume) {
	f.t.Helper()
	v.Status.Phase = corev1.VolumeReleased
	if _, err := f.client.CoreV1().PersistentVolumes().UpdateStatus(f.ctx, v, metav1.UpdateOptions{}); err != nil {
		f.t.Fatal(err)
	}
}

// TestProvisioner: a claim of a class of this provisioner, scheduled to
// this node, gets a local volume at its directory, a filesystem of its
// own of the claim's size (its image), bound to this node and the
// claim; a claim that would leave the data volume less than its reserve
// gets none; a released volume goes with its data (a link inside is not
// followed) and its image; what is not this node's, or asks for what a
// local volume cannot be, gets nothing.
func TestProvisioner(t *testing.T) {
	f := start(t)
	c := f.claim("data", "local", "n1", "1Gi", corev1.ReadWriteOnce)
	v := f.volume("pvc-uid-data", false)
	dir, image := filepath.Join(f.dir, "pvc-uid-data"), filepath.Join(f.images, "pvc-uid-data.img")
	if v.Spec.Local == nil || v.Spec.Local.Path != dir || volumeNode(v) != "n1" || v.Spec.StorageClassName != "local" ||
		v.Spec.PersistentVolumeReclaimPolicy != corev1.PersistentVolumeReclaimDelete || v.Annotations[AnnProvisionedBy] != layout.LocalVolumesProvisioner ||
		v.Spec.ClaimRef == nil || v.Spec.ClaimRef.UID != c.UID || v.Spec.ClaimRef.Name != "data" || v.Spec.ClaimRef.Namespace != "app" ||
		!v.Spec.Capacity.Storage().Equal(resource.MustParse("1Gi")) {
		t.Fatalf("the volume made: %+v", v)
	}
	f.event("Normal ProvisioningSucceeded", v.Name, "n1")
	st, err := os.Stat(dir)
	if err != nil || st.Mode().Perm() != 0o777 || !st.IsDir() {
		t.Fatalf("the volume's directory: %v, %v", st, err)
	}
	if st, err := os.Stat(image); err != nil || st.Size() != volumefs.ImageSize(1<<30) {
		t.Fatalf("the volume's image: %v, %v; want %d bytes", st, err, volumefs.ImageSize(1<<30))
	}
	f.claim("second", "local-retain", "n1", "10Mi", corev1.ReadWriteOncePod)
	v2 := f.volume("pvc-uid-second", false)
	if v2.Spec.PersistentVolumeReclaimPolicy != corev1.PersistentVolumeReclaimRetain {
		t.Errorf("a volume of a Retain class has reclaim policy %s", v2.Spec.PersistentVolumeReclaimPolicy)
	}

	// Not this provisioner's: another node's claim, another class.
	elsewhere := f.claim("elsewhere", "local", "n2", "1Gi", corev1.ReadWriteOnce)
	other := f.claim("other", "other", "n1", "1Gi", corev1.ReadWriteOnce)
	// What a local volume cannot be: refused with an event, no volume.
	many := f.claim("many", "local", "n1", "1Gi", corev1.ReadWriteMany)
	f.event("Warning ProvisioningFailed", "ReadWriteMany")
	huge := f.claim("huge", "local", "n1", "1Ei", corev1.ReadWriteOnce)
	f.event("Warning ProvisioningFailed", "more than the data volume")
	// 20 GiB free of 100, 12.5 GiB kept: a claim of 8 GiB cuts into it.
	f.fs.setFree(20 << 30)
	greedy := f.claim("greedy", "local", "n1", "8Gi", corev1.ReadWriteOnce)
	f.event("Warning ProvisioningFailed", "would leave the data volume less than")
	for _, c := range []*corev1.PersistentVolumeClaim{elsewhere, other, many, huge, greedy} {
		f.noVolume(c)
	}

	// Released: the data and the image go, and the volume. A link to a
	// file outside is removed, not followed.
	outside := filepath.Join(t.TempDir(), "precious")
	if err := os.WriteFile(outside, []byte("keep"), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.MkdirAll(filepath.Join(dir, "sub"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink(filepath.Dir(outside), filepath.Join(dir, "sub", "link")); err != nil {
		t.Fatal(err)
	}
	f.release(v)
	f.volume(v.Name, true)
	for _, p := range []string{dir, image} {
		if _, err := os.Stat(p); !errors.Is(err, os.ErrNotExist) {
			t.Errorf("the released volume's %s: %v", p, err)
		}
	}
	if b, err := os.ReadFile(outside); err != nil || string(b) != "keep" {
		t.Errorf("the file a link in the volume named: %q, %v", b, err)
	}
	// Retain, or another node's: kept.
	f.release(v2)
	foreign := &corev1.PersistentVolume{ObjectMeta: metav1.ObjectMeta{Name: "pvc-foreign", Annotations: map[string]string{AnnProvisionedBy: layout.LocalVolumesProvisioner}},
		Spec: corev1.PersistentVolumeSpec{PersistentVolumeReclaimPolicy: corev1.PersistentVolumeReclaimDelete,
			PersistentVolumeSource: corev1.PersistentVolumeSource{Local: &corev1.LocalVolumeSource{Path: filepath.Join(f.dir, "pvc-foreign")}},
			NodeAffinity: &corev1.VolumeNodeAffinity{Required: &corev1.NodeSelector{NodeSelectorTerms: []corev1.NodeSelectorTerm{{
				MatchExpressions: []corev1.NodeSelectorRequirement{{Key: corev1.LabelHostname, Operator: corev1.NodeSelectorOpIn, Values: []string{"n2"}}}}}}}}}
	if _, err := f.client.CoreV1().PersistentVolumes().Create(f.ctx, foreign, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	f.release(foreign)
	// A volume released after them is deleted: the provisioner has
	// seen both by then.
	f.fs.setFree(90 << 30)
	f.claim("third", "local", "n1", "1Mi", corev1.ReadWriteOnce)
	v3 := f.volume("pvc-uid-third", false)
	f.release(v3)
	f.volume(v3.Name, true)
	f.volume(v2.Name, false)
	f.volume(foreign.Name, false)
	if _, err := os.Stat(filepath.Join(f.dir, v2.Name)); err != nil {
		t.Errorf("the retained volume's directory: %v", err)
	}
}
