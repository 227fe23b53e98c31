// Package image builds Plinth node images from a board definition.
//
//	Debian kernel .deb ──► vmlinuz ─────────────────────────────────► vmlinuz
//	       │
//	       └─► modules ──► early closure ──┐
//	                     └► system closure ─┼─► squashfs + dm-verity ─► system.img ─┐
//	kube, containerd, runc, CNI ───────────┤                                        │
//	testpod ──► pause + test OCI images ───┤                                        │
//	nft, mkfs (+ libraries, build host) ───┘                                        │
//	/init (static Go) ──────────────────────────────────────────────────────────────┴─► initramfs.img
//	verity root hash ──► kernel command line ──► cmdline, manifest.json
//	systemd-stub + vmlinuz + command line + initramfs ──► plinth.efi (UKI: network boot)
//	     "     + vmlinuz + … plinth.slot=a|b + /init and modules only ──► plinth-a.efi, plinth-b.efi
//	GPT: ESP (FAT32: slot a's UKI) + slot a (system.img) + slot b ──► disk.img (flash: write-disk)
//	predicted PCR 11 and Authenticode digest of each UKI ──► manifest.json
//	release key (-sign-key) ──► /etc/plinth/release.pub in the system image; manifest.sig
//
// Every step is deterministic (sorted entries, fixed timestamps, owners and
// modes, content-derived salt), so the same inputs give the same bytes.
package image

import (
	"bytes"
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
	"strings"
	"time"

	"plinth.dev/plinth/board"
	"plinth.dev/plinth/platform/layout"
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

type buildState struct {
	Config
	board         *board.Board
	version       string
	kernel        *Kernel
	kernelSHA     string
	earlyModules  []*Module
	systemModules []*Module
	kubeModules   []*Module // in system image, loaded by the Kubernetes worker
	kubeFiles     []sysFile
	caCerts       []byte
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
	p := newProgress(c.Progress, 8)
	m := &Manifest{Board: b.board.Name, Version: b.version, Release: c.Release, KernelPackage: b.board.KernelPackage,
		Artefacts: map[string]Artefact{}, SystemFiles: map[string]Artefact{}}

	err = p.step("read kernel package "+filepath.Base(c.KernelPackage), func() (string, error) {
		data, err := os.ReadFile(c.KernelPackage)
		if err != nil {
			return "", err
		}
		sum := sha256.Sum256(data)
		b.kernelSHA = hex.EncodeToString(sum[:])
		if b.kernel, err = ReadKernelPackage(c.KernelPackage); err != nil {
			return "", err
		}
		if !strings.HasSuffix(b.board.KernelPackage, b.kernel.Version) {
			return "", fmt.Errorf("package holds kernel %s, board %s wants %s", b.kernel.Version, b.board.Name, b.board.KernelPackage)
		}
		return fmt.Sprintf("kernel %s, %d modules", b.kernel.Version, len(b.kernel.Modules)), nil
	})
	if err != nil {
		return nil, err
	}
	m.KernelVersion, m.KernelPackageSHA256 = b.kernel.Version, b.kernelSHA

	err = p.step("resolve module dependencies", func() (string, error) {
		if b.earlyModules, err = b.kernel.Closure(b.board.EarlyModules); err != nil {
			return "", err
		}
		all, err := b.kernel.Closure(slices.Concat(b.board.EarlyModules, b.board.SystemModules, b.board.KubernetesModules))
		if err != nil {
			return "", err
		}
		kube, err := b.kernel.Closure(b.board.KubernetesModules)
		if err != nil {
			return "", err
		}
		early := map[string]bool{}
		for _, e := range b.earlyModules {
			early[e.Name] = true
			m.EarlyModules = append(m.EarlyModules, e.Name)
		}
		for _, s := range all {
			if !early[s.Name] {
				b.systemModules = append(b.systemModules, s)
				m.SystemModules = append(m.SystemModules, s.Name)
			}
		}
		// Early modules are loaded at boot and live only in the initramfs.
		for _, k := range kube {
			if !early[k.Name] {
				b.kubeModules = append(b.kubeModules, k)
				m.KubernetesModules = append(m.KubernetesModules, k.Name)
			}
		}
		return fmt.Sprintf("%d early (from %d asked), %d in the system image, %d of them for Kubernetes (from %d asked)",
			len(b.earlyModules), len(b.board.EarlyModules), len(b.systemModules), len(b.kubeModules), len(b.board.KubernetesModules)), nil
	})
	if err != nil {
		return nil, err
	}

	err = p.step("check Kubernetes binaries, write container images", func() (string, error) {
		if b.kubeFiles, err = kubernetesFiles(c.Binaries, b.board.Arch); err != nil {
			return "", err
		}
		var total int64
		var sizes []string
		for _, f := range b.kubeFiles {
			a, err := fileArtefact(f)
			if err != nil {
				return "", err
			}
			m.SystemFiles["/"+f.Path] = a
			total += a.Size
			sizes = append(sizes, fmt.Sprintf("%s %s", filepath.Base(f.Path), mib(a.Size)))
		}
		return fmt.Sprintf("%s in all: %s", mib(total), strings.Join(sizes, ", ")), nil
	})
	if err != nil {
		return nil, err
	}

	sysPath := filepath.Join(c.OutDir, SystemFile)
	err = p.step("build system image (squashfs + dm-verity)", func() (string, error) {
		ca := c.CACertificates
		if ca == "" {
			ca = "/etc/ssl/certs/ca-certificates.crt"
		}
		if data, err := os.ReadFile(ca); err == nil {
			b.caCerts = data
		} else if c.CACertificates != "" {
			return "", err
		}
		tree, err := systemTree(b)
		if err != nil {
			return "", err
		}
		vp, dataSize, err := buildSquashfs(ctx, tmp, sysPath, tree, p)
		if err != nil {
			return "", err
		}
		m.Verity = VerityInfo{RootHash: hex.EncodeToString(vp.RootHash), Salt: hex.EncodeToString(vp.Salt),
			DataBlocks: vp.DataBlocks, HashStartBlock: vp.HashStartBlock}
		m.Cmdline = strings.Join(append(b.board.KernelCmdline(), "plinth.verity="+vp.String()), " ")
		st, err := os.Stat(sysPath)
		if err != nil {
			return "", err
		}
		return fmt.Sprintf("%s data + %s hash tree, root hash %s", mib(dataSize), mib(st.Size()-dataSize), m.Verity.RootHash[:16]), nil
	})
	if err != nil {
		return nil, err
	}

	var initramfs, bootInitramfs []byte
	err = p.step("build initramfs", func() (string, error) {
		initBin, err := os.ReadFile(c.Init)
		if err != nil {
			return "", err
		}
		sys, err := os.ReadFile(sysPath)
		if err != nil {
			return "", err
		}
		files := []initramfsFile{{Path: "init", Data: initBin, Mode: 0o755}}
		var load []string
		for _, mod := range b.earlyModules {
			files = append(files, initramfsFile{Path: modulePath(b.kernel.Version, mod.Path), Data: mod.Data, Mode: 0o644})
			load = append(load, mod.Path)
		}
		files = append(files, initramfsFile{Path: layout.ModuleLoadList, Data: []byte(strings.Join(load, "\n") + "\n"), Mode: 0o644})
		var buf, boot bytes.Buffer
		if err := writeBootSegment(&boot, files); err != nil {
			return "", err
		}
		if err := writeSystemSegment(&buf, sys); err != nil {
			return "", err
		}
		buf.Write(boot.Bytes())
		if err := writeFileAtomic(filepath.Join(c.OutDir, InitramfsFile), buf.Bytes()); err != nil {
			return "", err
		}
		initramfs, bootInitramfs = buf.Bytes(), boot.Bytes()
		return fmt.Sprintf("%s (/init %s, %d modules; %s without the system image)",
			mib(int64(buf.Len())), mib(int64(len(initBin))), len(b.earlyModules), mib(int64(boot.Len()))), nil
	})
	if err != nil {
		return nil, err
	}

	err = p.step("build UKIs (network boot, slot a, slot b)", func() (string, error) {
		return b.writeUKIs(m, initramfs, bootInitramfs)
	})
	if err != nil {
		return nil, err
	}

	err = p.step("write disk image", func() (string, error) {
		root, _ := hex.DecodeString(m.Verity.RootHash)
		files := []espFile{
			{Path: layout.ESPBootFile, Source: filepath.Join(c.OutDir, UKISlotFile("a"))},
			{Path: layout.ESPSlotUKI("a"), Source: filepath.Join(c.OutDir, UKISlotFile("a"))},
		}
		m.Disk, err = writeDisk(ctx, tmp, filepath.Join(c.OutDir, DiskFile), sysPath, files, root)
		if err != nil {
			return "", err
		}
		return fmt.Sprintf("%s: ESP %d MiB, slots a and b %d MiB each (a holds the system image)", mib(m.Disk.Size), DiskESPMiB, DiskSlotMiB), nil
	})
	if err != nil {
		return nil, err
	}

	err = p.step("write kernel, command line and manifest", func() (string, error) {
		if err := writeFileAtomic(filepath.Join(c.OutDir, KernelFile), b.kernel.Image); err != nil {
			return "", err
		}
		if err := writeFileAtomic(filepath.Join(c.OutDir, CmdlineFile), []byte(m.Cmdline+"\n")); err != nil {
			return "", err
		}
		for _, name := range []string{KernelFile, InitramfsFile, SystemFile, CmdlineFile, UKIFile, UKISlotFile("a"), UKISlotFile("b"), DiskFile} {
			a, err := hashFile(filepath.Join(c.OutDir, name))
			if err != nil {
				return "", err
			}
			m.Artefacts[name] = a
		}
		if err := WriteManifest(c.OutDir, m, c.SignKey); err != nil {
			return "", err
		}
		if c.SignKey == nil {
			return filepath.Join(c.OutDir, ManifestFile) + ", unsigned", nil
		}
		return fmt.Sprintf("%s, release %d signed by %s", filepath.Join(c.OutDir, ManifestFile), m.Release, m.ReleaseKey[:16]), nil
	})
	if err != nil {
		return nil, err
	}
	p.done()
	return m, nil
}

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

type progress struct {
	w     io.Writer
	n, of int
	start time.Time
}

func newProgress(w io.Writer, steps int) *progress {
	if w == nil {
		w = io.Discard
	}
	return &progress{w: w, of: steps, start: time.Now()}
}

func (p *progress) step(name string, fn func() (string, error)) error {
	p.n++
	fmt.Fprintf(p.w, "[%d/%d] %s ...\n", p.n, p.of, name)
	t := time.Now()
	detail, err := fn()
	if err != nil {
		fmt.Fprintf(p.w, "[%d/%d] %s FAILED after %.2fs: %v\n", p.n, p.of, name, time.Since(t).Seconds(), err)
		return fmt.Errorf("%s: %w", name, err)
	}
	fmt.Fprintf(p.w, "[%d/%d] done in %.2fs: %s\n", p.n, p.of, time.Since(t).Seconds(), detail)
	return nil
}

// every prints what status says every interval until the returned stop
// is called: a sign of life in a long step.
func (p *progress) every(interval time.Duration, status func() string) (stop func()) {
	done := make(chan struct{})
	finished := make(chan struct{})
	t := time.Now()
	go func() {
		defer close(finished)
		tick := time.NewTicker(interval)
		defer tick.Stop()
		for {
			select {
			case <-done:
				return
			case <-tick.C:
				fmt.Fprintf(p.w, "[%d/%d]   ... %.0fs: %s\n", p.n, p.of, time.Since(t).Seconds(), status())
			}
		}
	}()
	return func() { close(done); <-finished }
}

func (p *progress) done() {
	fmt.Fprintf(p.w, "build finished in %.2fs\n", time.Since(p.start).Seconds())
}
