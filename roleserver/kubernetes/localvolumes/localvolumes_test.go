package localvolumes

import (
	"context"
	"errors"
	"fmt"
	"hash/fnv"
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
)

// fakeQuotas are project quotas kept in memory, over real directories
// (the host's kernel has no quota support to test with; the VM tests
// use the real ones).
type fakeQuotas struct {
	mu       sync.Mutex
	off      bool
	projects map[string]uint32
	limits   map[uint32]uint64
}

func newFakeQuotas() *fakeQuotas {
	return &fakeQuotas{projects: map[string]uint32{}, limits: map[uint32]uint64{}}
}

func (q *fakeQuotas) On(string) (bool, error) {
	q.mu.Lock()
	defer q.mu.Unlock()
	return !q.off, nil
}

func (q *fakeQuotas) Project(p string) (uint32, error) {
	if _, err := os.Lstat(p); err != nil {
		return 0, err
	}
	q.mu.Lock()
	defer q.mu.Unlock()
	return q.projects[p], nil
}

func (q *fakeQuotas) SetProject(dir string, id uint32) error {
	if ents, err := os.ReadDir(dir); err != nil || len(ents) > 0 {
		return fmt.Errorf("SetProject %s: not an empty directory (%v)", dir, err)
	}
	q.mu.Lock()
	defer q.mu.Unlock()
	q.projects[dir] = id
	return nil
}

func (q *fakeQuotas) SetLimit(_ string, id uint32, n uint64) error {
	q.mu.Lock()
	defer q.mu.Unlock()
	if n == 0 {
		delete(q.limits, id)
	} else {
		q.limits[id] = n
	}
	return nil
}

func (q *fakeQuotas) limit(id uint32) (uint64, bool) {
	q.mu.Lock()
	defer q.mu.Unlock()
	n, ok := q.limits[id]
	return n, ok
}

type fixture struct {
	t      *testing.T
	ctx    context.Context
	client *fake.Clientset
	quotas *fakeQuotas
	events *record.FakeRecorder
	dir    string
}

func start(t *testing.T) *fixture {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	del := corev1.PersistentVolumeReclaimDelete
	retain := corev1.PersistentVolumeReclaimRetain
	wffc := storagev1.VolumeBindingWaitForFirstConsumer
	f := &fixture{t: t, ctx: ctx, quotas: newFakeQuotas(), events: record.NewFakeRecorder(100), dir: filepath.Join(t.TempDir(), "volumes"),
		client: fake.NewClientset(
			&storagev1.StorageClass{ObjectMeta: metav1.ObjectMeta{Name: "local"}, Provisioner: layout.LocalVolumesProvisioner,
				ReclaimPolicy: &del, VolumeBindingMode: &wffc},
			&storagev1.StorageClass{ObjectMeta: metav1.ObjectMeta{Name: "local-retain"}, Provisioner: layout.LocalVolumesProvisioner,
				ReclaimPolicy: &retain, VolumeBindingMode: &wffc},
			&storagev1.StorageClass{ObjectMeta: metav1.ObjectMeta{Name: "other"}, Provisioner: "example.com/other"},
		)}
	p := &Provisioner{Client: f.client, Node: "n1", Dir: f.dir, Quotas: f.quotas, Events: f.events, Log: t.Logf}
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
// this node, gets a local volume at its directory with a project of its
// own limited to its size, bound to this node and the claim; a released
// volume goes with its data (a link inside is not followed) and its
// limit; what is not this node's, or asks for what a local directory
// cannot be, gets nothing.
func TestProvisioner(t *testing.T) {
	f := start(t)
	c := f.claim("data", "local", "n1", "1Gi", corev1.ReadWriteOnce)
	v := f.volume("pvc-uid-data", false)
	dir := filepath.Join(f.dir, "pvc-uid-data")
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
	id, _ := f.quotas.Project(dir)
	if n, ok := f.quotas.limit(id); id < firstProject || id >= firstProject+projects || !ok || n != 1<<30 || v.Annotations[AnnProject] != fmt.Sprint(id) {
		t.Fatalf("the volume's project %d (annotated %s): limit %d %v, want 1Gi", id, v.Annotations[AnnProject], n, ok)
	}

	// The next volume's name hashes to a project that is taken: it gets
	// the one after.
	h := fnv.New32a()
	h.Write([]byte("pvc-uid-second"))
	taken := firstProject + h.Sum32()%projects
	if err := os.Mkdir(filepath.Join(f.dir, "other"), 0o700); err != nil {
		t.Fatal(err)
	}
	f.quotas.mu.Lock()
	f.quotas.projects[filepath.Join(f.dir, "other")] = taken
	f.quotas.mu.Unlock()
	f.claim("second", "local-retain", "n1", "10Mi", corev1.ReadWriteOncePod)
	v2 := f.volume("pvc-uid-second", false)
	if id2, _ := f.quotas.Project(filepath.Join(f.dir, v2.Name)); id2 != firstProject+(taken-firstProject+1)%projects || id2 == id {
		t.Errorf("the second volume's project %d; %d is taken", id2, taken)
	}
	if v2.Spec.PersistentVolumeReclaimPolicy != corev1.PersistentVolumeReclaimRetain {
		t.Errorf("a volume of a Retain class has reclaim policy %s", v2.Spec.PersistentVolumeReclaimPolicy)
	}

	// Not this provisioner's: another node's claim, another class.
	elsewhere := f.claim("elsewhere", "local", "n2", "1Gi", corev1.ReadWriteOnce)
	other := f.claim("other", "other", "n1", "1Gi", corev1.ReadWriteOnce)
	// What a local directory cannot be: refused with an event, no volume.
	many := f.claim("many", "local", "n1", "1Gi", corev1.ReadWriteMany)
	f.event("Warning ProvisioningFailed", "ReadWriteMany")
	huge := f.claim("huge", "local", "n1", "1Ei", corev1.ReadWriteOnce)
	f.event("Warning ProvisioningFailed", "more than the data volume")
	f.quotas.mu.Lock()
	f.quotas.off = true
	f.quotas.mu.Unlock()
	noQuota := f.claim("no-quota", "local", "n1", "1Gi", corev1.ReadWriteOnce)
	f.event("Warning ProvisioningFailed", "no project quotas")
	for _, c := range []*corev1.PersistentVolumeClaim{elsewhere, other, many, huge, noQuota} {
		f.noVolume(c)
	}

	// Released: the data and the limit go, and the volume. A link to a
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
	if _, err := os.Stat(dir); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("the released volume's directory: %v", err)
	}
	if _, ok := f.quotas.limit(id); ok {
		t.Error("the released volume's project keeps its limit")
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
	f.quotas.mu.Lock()
	f.quotas.off = false
	f.quotas.mu.Unlock()
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
