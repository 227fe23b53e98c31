// Package localvolumes is a node's local volume provisioner, run by the
// worker as `kube local-volumes`: it makes the PersistentVolumes of
// claims scheduled to its node, each a directory on the node's encrypted
// data volume limited to the claim's size by a project quota, and
// deletes them with their data when their claims are gone.
//
//	scheduler ── claim.annotations[volume.kubernetes.io/selected-node] = this node
//	    │         (StorageClass "local": WaitForFirstConsumer)
//	    ▼
//	provisioner (one per worker; user plinth:local-volumes:<node>)
//	  claim Pending, its class's provisioner is layout.LocalVolumesProvisioner
//	    ├─ the data volume has project quotas? no: a Warning Event, no volume
//	    ├─ mkdir layout.LocalVolumesDir/pvc-<claim UID>        (0777: any pod UID)
//	    ├─ a project ID unused on the filesystem, FS_XFLAG_PROJINHERIT
//	    ├─ the project's hard limit = the claim's request
//	    └─ PV: local path, node affinity this node, claimRef the claim
//	                                      ──► the PV controller binds it
//	  PV of this node Released, reclaim policy Delete
//	    ├─ rm -r its directory (never following a link a pod left)
//	    ├─ the project's limit lifted
//	    └─ PV deleted
//
// Why in Plinth's own code: the static local volume provisioner cannot
// provision, and the helper-pod provisioners need hostPath pods into the
// node's state, which the host path policy refuses to every pod. Why a
// project quota: a pod that fills its volume gets EDQUOT (ext4) or
// ENOSPC (XFS) at its limit, and the node's etcd, containerd and kubelet
// on the same filesystem keep their room. A node without project quotas
// provisions nothing: a volume without a limit would let one pod fill
// the node.
//
// Project IDs are kept below 1<<20: the kubelet's own quota monitoring
// (LocalStorageCapacityIsolationFSQuotaMonitoring) picks its IDs above.
// Each volume's ID is derived from its name and probed against the IDs
// of the volumes on disk, so one process that makes volumes one at a
// time never gives two the same.
package localvolumes

import (
	"context"
	"errors"
	"fmt"
	"hash/fnv"
	"os"
	"path/filepath"
	"strconv"
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
)

// Annotations the provisioner reads and writes.
const (
	// AnnSelectedNode is the scheduler's choice of node for a claim of a
	// WaitForFirstConsumer class.
	AnnSelectedNode = "volume.kubernetes.io/selected-node"
	// AnnProvisionedBy marks a PersistentVolume with its provisioner.
	AnnProvisionedBy = "pv.kubernetes.io/provisioned-by"
	// AnnProject is the volume's project ID on its node's data volume.
	AnnProject = "local.plinth.dev/project-id"
)

// Project IDs of local volumes: [firstProject, firstProject+projects).
const (
	firstProject = 1 << 16
	projects     = 1<<20 - firstProject
)

// Quotas are the data volume's project quotas (platform/storage's
// calls, KernelQuotas; a fake in tests).
type Quotas interface {
	// On reports whether the filesystem holding dir has project quotas.
	On(dir string) (bool, error)
	// Project is the project ID of path.
	Project(path string) (uint32, error)
	// SetProject tags the empty directory dir with id, inherited.
	SetProject(dir string, id uint32) error
	// SetLimit limits project id on the filesystem holding dir to
	// limit bytes (0: no limit).
	SetLimit(dir string, id uint32, limit uint64) error
}

// Provisioner makes and deletes the local PersistentVolumes of one
// node.
type Provisioner struct {
	Client kubernetes.Interface
	// Node is this node's name.
	Node string
	// Dir is where the volumes are made (layout.LocalVolumesDir).
	Dir    string
	Quotas Quotas
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
	p.Events.Eventf(c, corev1.EventTypeNormal, "ProvisioningSucceeded", "volume %s on node %s: %s limited to %s (project %s)",
		pv.Name, p.Node, pv.Spec.Local.Path, pv.Spec.Capacity.Storage(), pv.Annotations[AnnProject])
	p.Log("claim %s: made volume %s (%s, project %s)", key, pv.Name, pv.Spec.Capacity.Storage(), pv.Annotations[AnnProject])
	return nil
}

// Provision makes claim c's volume on this node: its directory with its
// project and limit, and its PersistentVolume. A directory left by an
// earlier try is used again with its project.
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
	on, err := p.Quotas.On(p.Dir)
	if err != nil {
		return nil, err
	}
	if !on {
		return nil, refuse("the data volume has no project quotas, so a volume here could not be limited to its size; " +
			"volumes go to nodes whose data volume has them (made by this version of Plinth)")
	}
	var fs unix.Statfs_t
	if err := unix.Statfs(p.Dir, &fs); err != nil {
		return nil, fmt.Errorf("statfs %s: %w", p.Dir, err)
	}
	if total := fs.Blocks * uint64(fs.Bsize); size.CmpInt64(int64(min(total, 1<<62))) > 0 {
		return nil, refuse("the claim's %s is more than the data volume's %s", &size, resource.NewQuantity(int64(total), resource.BinarySI))
	}

	name := "pvc-" + string(c.UID)
	dir := filepath.Join(p.Dir, name)
	id, err := p.project(dir)
	if err != nil {
		return nil, err
	}
	if err := p.Quotas.SetLimit(p.Dir, id, uint64(size.Value())); err != nil {
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
			AnnProject:       strconv.FormatUint(uint64(id), 10),
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

// project makes dir (if it is not there) with a project of its own, and
// returns its ID.
func (p *Provisioner) project(dir string) (uint32, error) {
	switch err := os.Mkdir(dir, 0o777); {
	case errors.Is(err, os.ErrExist):
		if id, err := p.Quotas.Project(dir); err != nil || id != 0 {
			return id, err
		}
	case err != nil:
		return 0, err
	}
	// Mode 0777 whatever the umask: pods of any UID write here.
	if err := os.Chmod(dir, 0o777); err != nil {
		return 0, err
	}
	used := map[uint32]bool{}
	entries, err := os.ReadDir(p.Dir)
	if err != nil {
		return 0, err
	}
	for _, e := range entries {
		if e.IsDir() && e.Name() != filepath.Base(dir) {
			id, err := p.Quotas.Project(filepath.Join(p.Dir, e.Name()))
			if err != nil {
				return 0, err
			}
			used[id] = true
		}
	}
	h := fnv.New32a()
	h.Write([]byte(filepath.Base(dir)))
	start := h.Sum32() % projects
	for i := uint32(0); i < projects; i++ {
		id := firstProject + (start+i)%projects
		if !used[id] {
			return id, p.Quotas.SetProject(dir, id)
		}
	}
	return 0, fmt.Errorf("no project ID left for %s", dir)
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

// Delete removes volume v's directory, lifts its project's limit and
// deletes v. A volume whose path is not its directory here is refused:
// its data is not this provisioner's to remove.
func (p *Provisioner) Delete(ctx context.Context, v *corev1.PersistentVolume) error {
	dir := filepath.Join(p.Dir, v.Name)
	if v.Spec.Local == nil || filepath.Clean(v.Spec.Local.Path) != dir {
		return fmt.Errorf("volume %s is not at %s: its data is left as it is", v.Name, dir)
	}
	id, err := p.Quotas.Project(dir)
	switch {
	case errors.Is(err, os.ErrNotExist):
	case err != nil:
		return err
	default:
		// os.RemoveAll opens every directory with O_NOFOLLOW relative to
		// its parent: a link a pod left inside is removed, never followed.
		if err := os.RemoveAll(dir); err != nil {
			return fmt.Errorf("removing volume %s's data: %w", v.Name, err)
		}
		if id != 0 {
			if err := p.Quotas.SetLimit(p.Dir, id, 0); err != nil {
				return err
			}
		}
	}
	uid := v.UID
	err = p.Client.CoreV1().PersistentVolumes().Delete(ctx, v.Name, metav1.DeleteOptions{Preconditions: &metav1.Preconditions{UID: &uid}})
	if err != nil && !apierrors.IsNotFound(err) {
		return fmt.Errorf("deleting PersistentVolume %s: %w", v.Name, err)
	}
	return nil
}

// KernelQuotas are the kernel's project quotas (quotactl_fd and
// FS_IOC_FS[GS]ETXATTR, platform/storage).
var KernelQuotas Quotas = kernelQuotas{}

type kernelQuotas struct{}

func (kernelQuotas) On(dir string) (bool, error)            { return storage.ProjectQuotaOnDir(dir) }
func (kernelQuotas) Project(path string) (uint32, error)    { return storage.Project(path) }
func (kernelQuotas) SetProject(dir string, id uint32) error { return storage.SetProject(dir, id) }
func (kernelQuotas) SetLimit(dir string, id uint32, n uint64) error {
	return storage.SetProjectLimit(dir, id, n)
}
