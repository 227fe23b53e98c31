// Package localstorage is the declarative tree of a node's storage. Code
// asks the tree for paths (root.Data.Etcd.Path()); it never builds path
// strings itself, so the layout is written down in one place: the struct
// tags below.
//
//	/                         Root
//	├── data/                 DataDirectory (encrypted data partition)
//	│   ├── etcd/             DataEtcdDirectory: peer-pki/, data/
//	│   ├── kubernetes/       DataKubernetesDirectory: pki/, kubelet/
//	│   ├── containerd/
//	│   └── node/             DataNodeDirectory: boot-count, credentials/, roles, hosts
//	└── ephemeral/            EphemeralDirectory (tmpfs, lost at reboot)
//	    ├── consensus/        EphemeralConsensusDirectory: client.sock (unlinked once etcd listens)
//	    ├── containerd/
//	    ├── kubernetes/       controller/{apiserver (etcd.sock), controller-manager, scheduler}/,
//	    │                     worker/, cni/, …
//	    └── log/
//
// Place fills in every path from the tags; Create makes the directories of
// one subtree, once its filesystem is mounted.
package localstorage

import (
	"fmt"
	"os"
	"path/filepath"
	"reflect"

	"plinth.dev/plinth/platform/atomicfile"
)

// Directory is one directory of the tree. Embed it in a struct whose
// fields, tagged `dir:"name"` or `file:"name"`, are its children.
type Directory struct{ path string }

// Path is the absolute path of the directory.
func (d *Directory) Path() string { return d.path }

// File is one file of the tree.
type File struct{ path string }

// Path is the absolute path of the file.
func (f *File) Path() string { return f.path }

// Read returns the contents of the file.
func (f *File) Read() ([]byte, error) { return os.ReadFile(f.path) }

// Write replaces the contents atomically: a crash leaves the old or the new
// contents, never a mix.
func (f *File) Write(data []byte, perm os.FileMode) error {
	return atomicfile.Write(f.path, data, perm)
}

// Root is the whole tree.
type Root struct {
	Directory
	Data      DataDirectory      `dir:"data"`
	Ephemeral EphemeralDirectory `dir:"ephemeral"`
}

// DataDirectory is the mount point of the encrypted data partition.
type DataDirectory struct {
	Directory
	Etcd       DataEtcdDirectory       `dir:"etcd"`
	Kubernetes DataKubernetesDirectory `dir:"kubernetes"`
	Containerd Directory               `dir:"containerd"`
	Node       DataNodeDirectory       `dir:"node"`
}

// DataEtcdDirectory holds the consensus member's state.
type DataEtcdDirectory struct {
	Directory
	PeerPKI Directory `dir:"peer-pki"`
	Data    Directory `dir:"data"`
}

// DataKubernetesDirectory holds Kubernetes state that must survive reboots.
type DataKubernetesDirectory struct {
	Directory
	PKI     Directory `dir:"pki"`
	Kubelet Directory `dir:"kubelet"`
	// PodLogs is where the kubelet and containerd keep containers' logs
	// (the system image's /var/log is read-only).
	PodLogs Directory `dir:"pod-logs"`
	// LocalVolumes holds the node's local PersistentVolumes, each a
	// filesystem of its own mounted here (layout.LocalVolumesDir), its
	// image in LocalVolumeImages (platform/volumefs).
	LocalVolumes      Directory `dir:"local-volumes"`
	LocalVolumeImages Directory `dir:"local-volume-images"`
	// Audit is a controller's API server's audit log
	// (roleserver/kubernetes/auditlog).
	Audit Directory `dir:"audit"`
}

// DataNodeDirectory holds the node's own state.
type DataNodeDirectory struct {
	Directory
	BootCount   File      `file:"boot-count"`
	Credentials Directory `dir:"credentials"`
	// Roles is the node's last known roles (clusterpb.NodeRoles, binary),
	// so a consensus member starts its etcd on a cold start before it can
	// reach any curator.
	Roles File `file:"roles"`
	// Hosts caches the node ID → address map of the cluster (hosts file
	// format), restored at boot so etcd peers named <node ID> resolve.
	Hosts File `file:"hosts"`
	// ClusterCRL is the newest cluster CRL this node received (DER), so
	// that revocations hold from the first handshake after a reboot.
	ClusterCRL File `file:"cluster-crl"`
	// UpdatePCRs holds the PCR values the node's keys are sealed to
	// while an A/B update is pending (platform/update's PCRSets): here,
	// not in the UEFI variable, which anyone with the machine can write.
	UpdatePCRs File `file:"update-pcrs"`
	// ReleaseTrust is the newest version of the cluster's release key
	// chain this node verified (platform/releasekeys.Trust, JSON): it
	// refuses a chain that does not lead on from it.
	ReleaseTrust File `file:"release-trust"`
}

// EphemeralDirectory is a tmpfs: gone at reboot.
type EphemeralDirectory struct {
	Directory
	Consensus  EphemeralConsensusDirectory  `dir:"consensus"`
	Containerd EphemeralContainerdDirectory `dir:"containerd"`
	Kubernetes EphemeralKubernetesDirectory `dir:"kubernetes"`
	Log        Directory                    `dir:"log"`
}

// EphemeralContainerdDirectory is containerd's state (sockets, shims).
type EphemeralContainerdDirectory struct {
	Directory
	Socket File `file:"containerd.sock"`
	// Config is containerd's generated configuration.
	Config File `file:"config.toml"`
	// Hosts is containerd's registry configuration (config_path): one
	// directory per registry of the cluster policy, with its hosts.toml
	// and CA certificates.
	Hosts Directory `dir:"hosts"`
}

// EphemeralKubernetesDirectory holds what the Kubernetes components are
// started with: generated configuration, certificates and keys (never on
// /data: they are made again at every start), and their sockets.
type EphemeralKubernetesDirectory struct {
	Directory
	// Controller is the API server's, controller manager's and
	// scheduler's configuration and credentials.
	Controller EphemeralControllerDirectory `dir:"controller"`
	// Worker is the kubelet's, kube-proxy's, DNS's and netd's.
	Worker Directory `dir:"worker"`
	// CNI holds the CNI network configuration netd writes once the node
	// has its pod CIDR.
	CNI Directory `dir:"cni"`
	// VolumePlugins is the kubelet's (the system image is read-only).
	VolumePlugins Directory `dir:"volume-plugins"`
	// CNICache is containerd's CNI result cache (mounted at /var/lib/cni).
	CNICache Directory `dir:"cni-cache"`
	// Registries is the kubelet's image credential provider: its
	// configuration, the registries' credentials (mode 0600: tmpfs only,
	// never /data) and the directory the kubelet runs it from.
	Registries EphemeralRegistriesDirectory `dir:"registries"`
}

// EphemeralRegistriesDirectory: see EphemeralKubernetesDirectory.Registries.
type EphemeralRegistriesDirectory struct {
	Directory
	Credentials    File      `file:"credentials.json"`
	ProviderConfig File      `file:"credential-providers.json"`
	Bin            Directory `dir:"bin"`
}

// EphemeralControllerDirectory holds one directory per control plane
// component, each owned by the unprivileged user the component runs as
// (mode 0700): no component reads another's keys.
type EphemeralControllerDirectory struct {
	Directory
	APIServer         EphemeralAPIServerDirectory `dir:"apiserver"`
	ControllerManager Directory                   `dir:"controller-manager"`
	Scheduler         Directory                   `dir:"scheduler"`
	MetricsServer     Directory                   `dir:"metrics-server"`
}

// EphemeralAPIServerDirectory is the API server's.
type EphemeralAPIServerDirectory struct {
	Directory
	// EtcdSocket is the API server's etcd endpoint, confined to the
	// /kubernetes/ prefix (consensus.Status.ServeKubernetes), which
	// serves the API server's user alone.
	EtcdSocket File `file:"etcd.sock"`
}

// EphemeralConsensusDirectory holds etcd's runtime files.
type EphemeralConsensusDirectory struct {
	Directory
	ClientSocket File `file:"client.sock"`
}

var (
	directoryType = reflect.TypeOf(Directory{})
	fileType      = reflect.TypeOf(File{})
)

// Place sets every path of the tree below root, which lives at base.
func Place(root *Root, base string) error {
	return place(reflect.ValueOf(root).Elem(), base)
}

func place(v reflect.Value, p string) error {
	switch v.Type() {
	case directoryType:
		v.Set(reflect.ValueOf(Directory{path: p}))
		return nil
	case fileType:
		v.Set(reflect.ValueOf(File{path: p}))
		return nil
	}
	if v.Kind() != reflect.Struct {
		return fmt.Errorf("localstorage: %s is a %s, not a directory or file", p, v.Type())
	}
	t := v.Type()
	embedded := false
	for i := 0; i < t.NumField(); i++ {
		f := t.Field(i)
		if f.Anonymous && f.Type == directoryType {
			v.Field(i).Set(reflect.ValueOf(Directory{path: p}))
			embedded = true
			continue
		}
		name := f.Tag.Get("dir")
		if name == "" {
			name = f.Tag.Get("file")
		}
		if name == "" {
			return fmt.Errorf("localstorage: field %s of %s has no dir or file tag", f.Name, t)
		}
		if err := place(v.Field(i), filepath.Join(p, name)); err != nil {
			return err
		}
	}
	if !embedded {
		return fmt.Errorf("localstorage: %s does not embed Directory", t)
	}
	return nil
}

// Create makes every directory of the subtree d (a pointer to any
// directory struct of a placed tree). Files are not created.
func Create(d any, perm os.FileMode) error {
	v := reflect.ValueOf(d)
	if v.Kind() != reflect.Pointer {
		return fmt.Errorf("localstorage: Create needs a pointer, got %T", d)
	}
	return create(v.Elem(), perm)
}

func create(v reflect.Value, perm os.FileMode) error {
	switch v.Type() {
	case directoryType:
		p := v.Interface().(Directory).path
		if p == "" {
			return fmt.Errorf("localstorage: tree not placed")
		}
		return os.MkdirAll(p, perm)
	case fileType:
		return nil
	}
	for i := 0; i < v.NumField(); i++ {
		if err := create(v.Field(i), perm); err != nil {
			return err
		}
	}
	return nil
}
