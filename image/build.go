// Package image builds Plinth node images from a board definition.
//
//	Debian kernel .deb ──► vmlinuz ─────────────────────────────────► vmlinuz
//	       │
//	       └─► modules ──► early closure ──┐
//	                     └► system closure ─┼─► squashfs + dm-verity ─► system.img ─┐
//	kube, containerd, crun, CNI ───────────┤                                        │
//	testpod ──► pause + test OCI images ───┤                                        │
//	user OCI archives (checked) ───────────┤                                        │
//	conformance images (when asked) ───────┤ (and conformance.tar beside the image) │
//	nft, mkfs (+ libraries, build host) ───┘                                        │
//	/init (static Go) ──────────────────────────────────────────────────────────────┴─► initramfs.img
//	verity root hash ──► kernel command line ──► cmdline, manifest.json
//	systemd-stub + vmlinuz + command line + initramfs ──► plinth.efi (UKI: network boot)
//	     "     + vmlinuz + … plinth.slot=a|b + /init and modules only ──► plinth-a.efi, plinth-b.efi
//	GPT: ESP (FAT32: slot a's UKI) + slot a (system.img) + slot b ──► disk.img (flash: write-disk)
//	predicted PCR 11 and Authenticode digest of each UKI ──► manifest.json
//	release key (--sign-key) ──► /etc/plinth/release.pub in the system image; manifest.sig
//
// Every step is deterministic (sorted entries, fixed timestamps, owners and
// modes, content-derived salt), so the same inputs give the same bytes.
package image

import (
	"context"
	"crypto/ed25519"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"slices"

	"plinth.dev/plinth/board"
)

// Config of one build.
type Config struct {
	Board *board.Board
	// KernelPackage is the path of the board's Debian kernel package.
	KernelPackage string
	// Init is the static /init binary.
	Init string
	// Binaries are Kubernetes, the container runtime, the CNI plugins and
	// testpod (BinariesIn names them as make builds them).
	Binaries Binaries
	// OutDir receives the artefacts; it is created if missing.
	OutDir string
	// Version names this build in the image (default "dev").
	Version string
	// Release is the build's release number: nodes install an image only
	// if its release is not older than the one they run. 0: unreleased.
	Release uint64
	// SignKey is the release key that signs the manifest (SignatureFile)
	// and whose public key the system image carries
	// (layout.ReleaseKeyPath). nil: the image is unsigned, and no node
	// installs it as an update.
	SignKey ed25519.PrivateKey
	// CACertificates is a PEM bundle for the system image (default: the
	// build host's /etc/ssl/certs/ca-certificates.crt when it exists).
	CACertificates string
	// Stub is systemd's EFI stub the UKIs are built on (default
	// DefaultStub).
	Stub string
	// NetbootArgs are added to the network-boot UKI's command line only,
	// e.g. a cluster's shared register parameters (plinth.parameters=),
	// which the stub then measures with it.
	NetbootArgs []string
	// OCIArchives are the user's own OCI image archives, carried in the
	// system image and imported and pinned at boot (userimages.go).
	OCIArchives []OCIArchive
	// Conformance, if set, adds the upstream conformance tests' images
	// (conformance.go), for `make conformance`.
	Conformance *ConformanceInputs
	// Progress receives one line per build step (nil: silent).
	Progress io.Writer
}

// Artefact names in OutDir.
const (
	KernelFile    = "vmlinuz"
	InitramfsFile = "initramfs.img"
	SystemFile    = "system.img"
	CmdlineFile   = "cmdline"
	ManifestFile  = "manifest.json"
)

// Manifest describes one build. It holds no timestamps: two builds of the
// same inputs have equal manifests.
type Manifest struct {
	Board               string     `json:"board"`
	Version             string     `json:"version"`
	Release             uint64     `json:"release"`               // Config.Release: orders images
	ReleaseKey          string     `json:"release_key,omitempty"` // hex ed25519 public key of the signer (SignatureFile); "" unsigned
	KernelPackage       string     `json:"kernel_package"`
	KernelPackageSHA256 string     `json:"kernel_package_sha256"`
	KernelVersion       string     `json:"kernel_version"`
	Cmdline             string     `json:"cmdline"`
	Verity              VerityInfo `json:"verity"`
	EarlyModules        []string   `json:"early_modules"`
	SystemModules       []string   `json:"system_modules"`
	// KubernetesModules are the entries of layout.KubernetesModuleLoadList.
	KubernetesModules []string            `json:"kubernetes_modules"`
	Artefacts         map[string]Artefact `json:"artefacts"`
	// SystemFiles are the programs and container images the system image
	// carries for Kubernetes, by absolute path on the node.
	SystemFiles map[string]Artefact `json:"system_files"`
	// ContainerImages are the images the system image carries (the
	// node's own and the user's, --oci-archive), by reference.
	ContainerImages []ContainerImage `json:"container_images"`
	// UKIs are the Unified Kernel Images by artefact name, with their
	// predicted PCRs.
	UKIs map[string]UKIInfo `json:"ukis"`
	// Disk is the layout of disk.img.
	Disk *DiskLayout `json:"disk"`
}

// VerityInfo describes the dm-verity protection of the system image.
type VerityInfo struct {
	RootHash       string `json:"root_hash"`
	Salt           string `json:"salt"`
	DataBlocks     uint64 `json:"data_blocks"`
	HashStartBlock uint64 `json:"hash_start_block"`
}

// Artefact is one output file.
type Artefact struct {
	SHA256 string `json:"sha256"`
	Size   int64  `json:"size"`
}

// buildState is one build: its configuration and what each step gives
// the steps after it. Build runs the steps in the order steps() lists
// them; a step reads only fields set before it and sets its own, as the
// comments on the fields say.
type buildState struct {
	Config
	board   *board.Board
	version string    // Config.Version, or "dev"
	tmp     string    // scratch directory in OutDir, removed after the build
	prog    *progress // for a long step's signs of life
	// m is the manifest each step adds its part to; the last writes it.
	m *Manifest

	// readKernel
	kernel    *Kernel
	kernelSHA string
	// resolveModules
	earlyModules  []*Module
	systemModules []*Module
	kubeModules   []*Module // in system image, loaded by the Kubernetes worker
	// kubernetesBinaries
	kubeFiles []sysFile
	// systemImage (caCerts before the tree is made: systemTree reads it)
	caCerts []byte
	// buildInitramfs: the whole initramfs (network boot) and its boot
	// segment alone (the slots' UKIs, whose system image is a partition)
	initramfs, bootInitramfs []byte
}

// buildStep is one step of a build: its name in the progress output
// (cmd/plinthbench reports each step's time under it), and what it does,
// which returns a one-line summary.
type buildStep struct {
	name string
	run  func(context.Context) (detail string, err error)
}

// steps are the build's steps in order (see the package comment); the
// conformance images' only when asked for.
func (b *buildState) steps() []buildStep {
	var conformance []buildStep
	if b.Conformance != nil {
		conformance = append(conformance, buildStep{"write the conformance test images", b.conformanceImages})
	}
	return slices.Concat([]buildStep{
		{"read kernel package " + filepath.Base(b.KernelPackage), b.readKernel},
		{"resolve module dependencies", b.resolveModules},
		{"check Kubernetes binaries, write container images", b.kubernetesBinaries},
		{"check the user's OCI image archives", b.userImages},
	}, conformance, []buildStep{
		{"build system image (squashfs + dm-verity)", b.systemImage},
		{"build initramfs", b.buildInitramfs},
		{"build UKIs (network boot, slot a, slot b)", b.writeUKIs},
		{"write disk image", b.writeDiskImage},
		{"write kernel, command line and manifest", b.writeManifest},
	})
}

// Build runs every step and returns the manifest it wrote.
func Build(ctx context.Context, c Config) (*Manifest, error) {
	if c.Board == nil || c.KernelPackage == "" || c.Init == "" || c.OutDir == "" {
		return nil, fmt.Errorf("image: Board, KernelPackage, Init and OutDir are required")
	}
	// A binary the node cannot run is refused before anything is read.
	if err := c.Binaries.check(c.Board.Arch); err != nil {
		return nil, fmt.Errorf("image: %w", err)
	}
	b := &buildState{Config: c, board: c.Board, version: c.Version}
	if b.version == "" {
		b.version = "dev"
	}
	if err := os.MkdirAll(c.OutDir, 0o755); err != nil {
		return nil, err
	}
	tmp, err := os.MkdirTemp(c.OutDir, ".build-")
	if err != nil {
		return nil, err
	}
	defer os.RemoveAll(tmp)
	b.tmp = tmp
	steps := b.steps()
	b.prog = newProgress(c.Progress, len(steps))
	b.m = &Manifest{Board: b.board.Name, Version: b.version, Release: c.Release, KernelPackage: b.board.KernelPackage,
		Artefacts: map[string]Artefact{}, SystemFiles: map[string]Artefact{}}
	for _, s := range steps {
		if err := b.prog.step(s.name, func() (string, error) { return s.run(ctx) }); err != nil {
			return nil, err
		}
	}
	b.prog.done()
	return b.m, nil
}

// out is the path of the artefact name in OutDir.
func (b *buildState) out(name string) string { return filepath.Join(b.OutDir, name) }

// ReadManifest loads the manifest of a build directory.
func ReadManifest(dir string) (*Manifest, error) {
	data, err := os.ReadFile(filepath.Join(dir, ManifestFile))
	if err != nil {
		return nil, err
	}
	var m Manifest
	if err := json.Unmarshal(data, &m); err != nil {
		return nil, fmt.Errorf("%s: %w", filepath.Join(dir, ManifestFile), err)
	}
	return &m, nil
}

func hashFile(p string) (Artefact, error) {
	f, err := os.Open(p)
	if err != nil {
		return Artefact{}, err
	}
	defer f.Close()
	h := sha256.New()
	n, err := io.Copy(h, f)
	if err != nil {
		return Artefact{}, err
	}
	return Artefact{SHA256: hex.EncodeToString(h.Sum(nil)), Size: n}, nil
}

// writeFileAtomic never leaves a half-written artefact behind a crash.
func writeFileAtomic(p string, data []byte) error {
	tmp := p + ".tmp"
	if err := os.WriteFile(tmp, data, 0o644); err != nil {
		return err
	}
	return os.Rename(tmp, p)
}

func mib(n int64) string { return fmt.Sprintf("%.1f MiB", float64(n)/(1<<20)) }
