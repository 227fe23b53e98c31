// Package localvolumes is a node's local volume provisioner, run by the
// worker as `kube local-volumes`: it makes the PersistentVolumes of
// claims scheduled to its node, each a filesystem of its own on the
// node's encrypted data volume (platform/volumefs), of the claim's size,
// and deletes them with their data when their claims are gone.
//
//	scheduler ── claim.annotations[volume.kubernetes.io/selected-node] = this node
//	    │         (StorageClass "local": WaitForFirstConsumer)
//	    ▼
//	provisioner (one per worker; user plinth:local-volumes:<node>)
//	  claim Pending, its class's provisioner is layout.LocalVolumesProvisioner
//	    ├─ the data volume keeps its reserve after it? no: a Warning Event, no volume
//	    ├─ image <images>/pvc-<claim UID>.img, allocated whole, ext4
//	    ├─ mounted at layout.LocalVolumesDir/pvc-<claim UID>   (root 0777: any pod UID)
//	    └─ PV: local path, node affinity this node, claimRef the claim
//	                                      ──► the PV controller binds it
//	  PV of this node Released, reclaim policy Delete
//	    ├─ unmounted, its image removed (a volume of an earlier version, a
//	    │  directory with a project quota: removed, never following a link)
//	    └─ PV deleted
//	worker start (before the kubelet): every image mounted again (volumefs.AttachAll)
//
// Why in Plinth's own code: the static local volume provisioner cannot
// provision, and the helper-pod provisioners need hostPath pods into the
// node's state, which the host path policy refuses to every pod. Why a
// filesystem per volume: a pod that fills its volume gets ENOSPC at its
// size whatever it does to its files (a project quota it could leave
// with `chattr -p 0`, see platform/volumefs), and the node's etcd,
// containerd and kubelet on the data volume keep their room: the images
// are allocated when they are made, and none is made that would leave
// the data volume less than Reserve.
package localvolumes

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"time"

	"golang.org/x/sys/unix"
	corev1 "k8s.io/api/core/v1"
	storagev1 "k8s.io/api/storage/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/kubernetes/scheme"
	typedcorev1 "k8s.io/client-go/kubernetes/typed/core/v1"
	corelisters "k8s.io/client-go/listers/core/v1"
	storagelisters "k8s.io/client-go/listers/storage/v1"
	"k8s.io/client-go/tools/cache"
	"k8s.io/client-go/tools/record"
	"k8s.io/client-go/util/workqueue"

	"plinth.dev/plinth/platform/layout"
	"plinth.dev/plinth/platform/storage"
	"plinth.dev/plinth/platform/volumefs"
)

// Annotations the provisioner reads and writes.
const (
	// AnnSelectedNode is the scheduler's choice of node for a claim of a
	// WaitForFirstConsumer class.
	AnnSelectedNode = "volume.kubernetes.io/selected-node"
	// AnnProvisionedBy marks a PersistentVolume with its provisioner.
	AnnProvisionedBy = "pv.kubernetes.io/provisioned-by"
)

// Filesystems are the volumes' own filesystems (KernelFilesystems; a
// fake in tests).
type Filesystems interface {
	// Make makes dir's filesystem in image, for size bytes, and mounts
	// it at dir (volumefs.Make).
	Make(ctx context.Context, dir, image string, size int64) error
	// Remove removes volume dir with its data: its filesystem and image,
	// or, for a volume of an earlier version (no image), the directory
	// and its project quota's limit.
	Remove(dir, image string) error
	// ImageSize is how much of the data volume a volume of size takes.
	ImageSize(size int64) int64
	// Space is the size and the free space of the data volume holding
	// dir, in bytes.
	Space(dir string) (total, free uint64, err error)
}

// Reserve is what the data volume keeps free of volumes for the node's
// own state (etcd, containerd, the kubelet, pods' logs and scratch
// space): an eighth of it, at least 512 MiB.
func Reserve(total uint64) uint64 { return max(total/8, 512<<20) }

// Provisioner makes and deletes the local PersistentVolumes of one
// node.
type Provisioner struct {
	Client kubernetes.Interface
	// Node is this node's name.
	Node string
	// Dir is where the volumes are made (layout.LocalVolumesDir), Images
	// where their images are kept (not below Dir: no volume's path may
	// reach them).
	Dir, Images string
	FS          Filesystems
	// Events reports on claims (nil: to the API server).
	Events record.EventRecorder
	// Log says what the provisioner does (nil: nothing).
	Log func(format string, args ...any)

	claims  corelisters.PersistentVolumeClaimLister
	volumes corelisters.PersistentVolumeLister
	classes storagelisters.StorageClassLister
}

// Work items of the queue.
type item struct {
	claim  string // namespace/name
	volume string // name
}

// Run provisions and deletes until ctx ends.
func (p *Provisioner) Run(ctx context.Context) error {
	if p.Log == nil {
		p.Log = func(string, ...any) {}
	}
	if p.Events == nil {
		b := record.NewBroadcaster(record.WithContext(ctx))
		b.StartRecordingToSink(&typedcorev1.EventSinkImpl{Interface: p.Client.CoreV1().Events("")})
		defer b.Shutdown()
		p.Events = b.NewRecorder(scheme.Scheme, corev1.EventSource{Component: "plinth-local-volumes", Host: p.Node})
	}
	if err := os.MkdirAll(p.Dir, 0o700); err != nil {
		return err
	}
	factory := informers.NewSharedInformerFactory(p.Client, 10*time.Minute)
	claims := factory.Core().V1().PersistentVolumeClaims()
	volumes := factory.Core().V1().PersistentVolumes()
	classes := factory.Storage().V1().StorageClasses()
	p.claims, p.volumes, p.classes = claims.Lister(), volumes.Lister(), classes.Lister()

	queue := workqueue.NewTypedRateLimitingQueue(workqueue.DefaultTypedControllerRateLimiter[item]())
	defer queue.ShutDown()
	onClaim := func(obj any) {
		if c, ok := obj.(*corev1.PersistentVolumeClaim); ok && c.Annotations[AnnSelectedNode] == p.Node {
			queue.Add(item{claim: c.Namespace + "/" + c.Name})
		}
	}
	onVolume := func(obj any) {
		if v, ok := obj.(*corev1.PersistentVolume); ok && p.ours(v) {
			queue.Add(item{volume: v.Name})
		}
	}
	for _, h := range []struct {
		inf cache.SharedIndexInformer
		add func(any)
	}{{claims.Informer(), onClaim}, {volumes.Informer(), onVolume}} {
		if _, err := h.inf.AddEventHandler(cache.ResourceEventHandlerFuncs{
			AddFunc: h.add, UpdateFunc: func(_, obj any) { h.add(obj) },
		}); err != nil {
			return err
		}
	}
	classes.Informer()
	factory.Start(ctx.Done())
	defer factory.Shutdown()
	for typ, ok := range factory.WaitForCacheSync(ctx.Done()) {
		if !ok {
			return fmt.Errorf("local volumes: the %v cache did not sync: %w", typ, ctx.Err())
		}
	}
	p.Log("provisioning local volumes of node %s in %s", p.Node, p.Dir)
	go func() {
		<-ctx.Done()
		queue.ShutDown()
	}()
	for {
		it, quit := queue.Get()
		if quit {
			return ctx.Err()
		}
		var err error
		if it.claim != "" {
			err = p.syncClaim(ctx, it.claim)
		} else {
			err = p.syncVolume(ctx, it.volume)
		}
		if err != nil {
			p.Log("%+v: %v (retried)", it, err)
			queue.AddRateLimited(it)
		} else {
			queue.Forget(it)
		}
		queue.Done(it)
	}
}

// ours reports whether v is a local volume this node's provisioner made.
func (p *Provisioner) ours(v *corev1.PersistentVolume) bool {
	return v.Annotations[AnnProvisionedBy] == layout.LocalVolumesProvisioner && volumeNode(v) == p.Node
}

// volumeNode is the one node v's affinity names ("" if not exactly one).
func volumeNode(v *corev1.PersistentVolume) string {
	na := v.Spec.NodeAffinity
	if na == nil || na.Required == nil || len(na.Required.NodeSelectorTerms) != 1 {
		return ""
	}
	t := na.Required.NodeSelectorTerms[0]
	if len(t.MatchExpressions) != 1 || len(t.MatchFields) != 0 {
		return ""
	}
	e := t.MatchExpressions[0]
	if e.Key != corev1.LabelHostname || e.Operator != corev1.NodeSelectorOpIn || len(e.Values) != 1 {
		return ""
	}
	return e.Values[0]
}

// errNotProvisionable is a claim this provisioner will not make a volume
// for, as it stands: said in an Event, not retried until the claim
// changes.
var errNotProvisionable = errors.New("not provisionable")

// syncClaim makes the volume of the claim key, if it is this node's to
// make and has none.
func (p *Provisioner) syncClaim(ctx context.Context, key string) error {
	ns, name, err := cache.SplitMetaNamespaceKey(key)
	if err != nil {
		return nil
	}
	c, err := p.claims.PersistentVolumeClaims(ns).Get(name)
	if apierrors.IsNotFound(err) {
		return nil
	} else if err != nil {
		return err
	}
	if c.Spec.VolumeName != "" || c.Status.Phase != corev1.ClaimPending || c.Annotations[AnnSelectedNode] != p.Node ||
		c.Spec.StorageClassName == nil || c.DeletionTimestamp != nil {
		return nil
	}
	class, err := p.classes.Get(*c.Spec.StorageClassName)
	if apierrors.IsNotFound(err) {
		return nil
	} else if err != nil {
		return err
	}
	if class.Provisioner != layout.LocalVolumesProvisioner {
		return nil
	}
	pvName := "pvc-" + string(c.UID)
	if _, err := p.volumes.Get(pvName); err == nil {
		return nil
	}
	pv, err := p.Provision(ctx, c, class)
	if errors.Is(err, errNotProvisionable) {
		p.Events.Event(c, corev1.EventTypeWarning, "ProvisioningFailed", err.Error())
		p.Log("claim %s: %v", key, err)
		return nil
	}
	if err != nil {
		p.Events.Event(c, corev1.EventTypeWarning, "ProvisioningFailed", err.Error())
		return err
	}
	p.Events.Eventf(c, corev1.EventTypeNormal, "ProvisioningSucceeded", "volume %s on node %s: %s, a filesystem of its own of %s",
		pv.Name, p.Node, pv.Spec.Local.Path, pv.Spec.Capacity.Storage())
	p.Log("claim %s: made volume %s (%s, a filesystem of its own)", key, pv.Name, pv.Spec.Capacity.Storage())
	return nil
}

// Provision makes claim c's volume on this node: its filesystem, mounted
// at its directory, and its PersistentVolume. A filesystem an earlier
// try made and mounted is used as it is.
func (p *Provisioner) Provision(ctx context.Context, c *corev1.PersistentVolumeClaim, class *storagev1.StorageClass) (*corev1.PersistentVolume, error) {
	refuse := func(format string, args ...any) error {
		return fmt.Errorf("%w: node %s: %s", errNotProvisionable, p.Node, fmt.Sprintf(format, args...))
	}
	if c.Spec.VolumeMode != nil && *c.Spec.VolumeMode != corev1.PersistentVolumeFilesystem {
		return nil, refuse("local volumes are directories: volume mode %s is not supported", *c.Spec.VolumeMode)
	}
	if c.Spec.Selector != nil {
		return nil, refuse("a claim with a selector is for existing volumes, not for a new one")
	}
	if c.Spec.DataSource != nil || c.Spec.DataSourceRef != nil {
		return nil, refuse("local volumes are made empty: a data source is not supported")
	}
	for _, m := range c.Spec.AccessModes {
		if m != corev1.ReadWriteOnce && m != corev1.ReadWriteOncePod {
			return nil, refuse("a local volume is on one node: access mode %s is not supported (ReadWriteOnce, ReadWriteOncePod)", m)
		}
	}
	size, ok := c.Spec.Resources.Requests[corev1.ResourceStorage]
	if !ok || size.Sign() <= 0 {
		return nil, refuse("the claim requests no storage size")
	}
	total, free, err := p.FS.Space(p.Dir)
	if err != nil {
		return nil, err
	}
	if size.CmpInt64(int64(min(total, 1<<62))) > 0 {
		return nil, refuse("the claim's %s is more than the data volume's %s", &size, resource.NewQuantity(int64(total), resource.BinarySI))
	}
	name := "pvc-" + string(c.UID)
	dir, image := filepath.Join(p.Dir, name), filepath.Join(p.Images, name+".img")
	_, statErr := os.Stat(image)
	if need := uint64(p.FS.ImageSize(size.Value())); statErr != nil && free < need+Reserve(total) {
		return nil, refuse("the claim's %s would leave the data volume less than the %s it keeps for the node's own state (%s free)", &size,
			resource.NewQuantity(int64(Reserve(total)), resource.BinarySI), resource.NewQuantity(int64(free), resource.BinarySI))
	}
	if err := p.FS.Make(ctx, dir, image, size.Value()); err != nil {
		return nil, err
	}
	reclaim := corev1.PersistentVolumeReclaimDelete
	if class.ReclaimPolicy != nil {
		reclaim = *class.ReclaimPolicy
	}
	fsMode := corev1.PersistentVolumeFilesystem
	pv := &corev1.PersistentVolume{
		ObjectMeta: metav1.ObjectMeta{Name: name, Annotations: map[string]string{
			AnnProvisionedBy: layout.LocalVolumesProvisioner,
		}},
		Spec: corev1.PersistentVolumeSpec{
			Capacity:                      corev1.ResourceList{corev1.ResourceStorage: size},
			AccessModes:                   c.Spec.AccessModes,
			PersistentVolumeReclaimPolicy: reclaim,
			StorageClassName:              class.Name,
			VolumeMode:                    &fsMode,
			ClaimRef: &corev1.ObjectReference{Kind: "PersistentVolumeClaim", APIVersion: "v1",
				Namespace: c.Namespace, Name: c.Name, UID: c.UID},
			PersistentVolumeSource: corev1.PersistentVolumeSource{Local: &corev1.LocalVolumeSource{Path: dir}},
			NodeAffinity: &corev1.VolumeNodeAffinity{Required: &corev1.NodeSelector{NodeSelectorTerms: []corev1.NodeSelectorTerm{{
				MatchExpressions: []corev1.NodeSelectorRequirement{{Key: corev1.LabelHostname, Operator: corev1.NodeSelectorOpIn, Values: []string{p.Node}}},
			}}}},
		},
	}
	made, err := p.Client.CoreV1().PersistentVolumes().Create(ctx, pv, metav1.CreateOptions{})
	if apierrors.IsAlreadyExists(err) {
		return pv, nil
	}
	if err != nil {
		return nil, fmt.Errorf("creating PersistentVolume %s: %w", name, err)
	}
	return made, nil
}

// syncVolume deletes volume name with its data if it is this node's,
// released by its claim, with reclaim policy Delete.
func (p *Provisioner) syncVolume(ctx context.Context, name string) error {
	v, err := p.volumes.Get(name)
	if apierrors.IsNotFound(err) {
		return nil
	} else if err != nil {
		return err
	}
	if !p.ours(v) || v.Status.Phase != corev1.VolumeReleased || v.Spec.PersistentVolumeReclaimPolicy != corev1.PersistentVolumeReclaimDelete ||
		v.DeletionTimestamp != nil {
		return nil
	}
	if err := p.Delete(ctx, v); err != nil {
		return err
	}
	p.Log("volume %s: released by %s/%s, deleted with its data", v.Name, v.Spec.ClaimRef.Namespace, v.Spec.ClaimRef.Name)
	return nil
}

// Delete removes volume v with its data (Filesystems.Remove) and
// deletes v. A volume whose path is not its directory here is refused:
// its data is not this provisioner's to remove.
func (p *Provisioner) Delete(ctx context.Context, v *corev1.PersistentVolume) error {
	dir := filepath.Join(p.Dir, v.Name)
	if v.Spec.Local == nil || filepath.Clean(v.Spec.Local.Path) != dir {
		return fmt.Errorf("volume %s is not at %s: its data is left as it is", v.Name, dir)
	}
	if err := p.FS.Remove(dir, filepath.Join(p.Images, v.Name+".img")); err != nil {
		return fmt.Errorf("removing volume %s's data: %w", v.Name, err)
	}
	uid := v.UID
	err := p.Client.CoreV1().PersistentVolumes().Delete(ctx, v.Name, metav1.DeleteOptions{Preconditions: &metav1.Preconditions{UID: &uid}})
	if err != nil && !apierrors.IsNotFound(err) {
		return fmt.Errorf("deleting PersistentVolume %s: %w", v.Name, err)
	}
	return nil
}

// KernelFilesystems are the node's (platform/volumefs, and
// platform/storage's project quotas for volumes of earlier versions).
var KernelFilesystems Filesystems = kernelFilesystems{}

type kernelFilesystems struct{}

func (kernelFilesystems) Make(ctx context.Context, dir, image string, size int64) error {
	return volumefs.Make(ctx, dir, image, size)
}

func (kernelFilesystems) ImageSize(size int64) int64 { return volumefs.ImageSize(size) }

func (kernelFilesystems) Remove(dir, image string) error {
	if _, err := os.Stat(image); err == nil {
		return volumefs.Remove(dir, image)
	}
	// A volume of an earlier version: a directory with a project quota.
	id, err := storage.Project(dir)
	if errors.Is(err, os.ErrNotExist) {
		return nil
	}
	if err != nil {
		return err
	}
	// os.RemoveAll opens every directory with O_NOFOLLOW relative to its
	// parent: a link a pod left inside is removed, never followed.
	if err := os.RemoveAll(dir); err != nil {
		return err
	}
	if id != 0 {
		return storage.SetProjectLimit(filepath.Dir(dir), id, 0)
	}
	return nil
}

func (kernelFilesystems) Space(dir string) (total, free uint64, err error) {
	var fs unix.Statfs_t
	if err := unix.Statfs(dir, &fs); err != nil {
		return 0, 0, fmt.Errorf("statfs %s: %w", dir, err)
	}
	return fs.Blocks * uint64(fs.Bsize), fs.Bavail * uint64(fs.Bsize), nil
}
