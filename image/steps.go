package image

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"

	"plinth.dev/plinth/platform/layout"
)

// The steps of a build, in the order buildState.steps lists them (the
// UKIs' step, writeUKIs, is in uki.go). Each returns the one-line summary
// the progress output shows when it is done.

// readKernel reads the board's kernel package: sets kernel and kernelSHA.
func (b *buildState) readKernel(context.Context) (string, error) {
	data, err := os.ReadFile(b.KernelPackage)
	if err != nil {
		return "", err
	}
	sum := sha256.Sum256(data)
	b.kernelSHA = hex.EncodeToString(sum[:])
	if b.kernel, err = ReadKernelPackage(b.KernelPackage); err != nil {
		return "", err
	}
	if !strings.HasSuffix(b.board.KernelPackage, b.kernel.Version) {
		return "", fmt.Errorf("package holds kernel %s, board %s wants %s", b.kernel.Version, b.board.Name, b.board.KernelPackage)
	}
	b.m.KernelVersion, b.m.KernelPackageSHA256 = b.kernel.Version, b.kernelSHA
	return fmt.Sprintf("kernel %s, %d modules", b.kernel.Version, len(b.kernel.Modules)), nil
}

// resolveModules closes the board's module lists over their dependencies:
// sets earlyModules (initramfs), systemModules (system image) and
// kubeModules (those of the system image the Kubernetes worker loads).
func (b *buildState) resolveModules(context.Context) (string, error) {
	var err error
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
		b.m.EarlyModules = append(b.m.EarlyModules, e.Name)
	}
	for _, s := range all {
		if !early[s.Name] {
			b.systemModules = append(b.systemModules, s)
			b.m.SystemModules = append(b.m.SystemModules, s.Name)
		}
	}
	// Early modules are loaded at boot and live only in the initramfs.
	for _, k := range kube {
		if !early[k.Name] {
			b.kubeModules = append(b.kubeModules, k)
			b.m.KubernetesModules = append(b.m.KubernetesModules, k.Name)
		}
	}
	return fmt.Sprintf("%d early (from %d asked), %d in the system image, %d of them for Kubernetes (from %d asked)",
		len(b.earlyModules), len(b.board.EarlyModules), len(b.systemModules), len(b.kubeModules), len(b.board.KubernetesModules)), nil
}

// kubernetesBinaries checks the Kubernetes binaries and writes the
// container images: sets kubeFiles.
func (b *buildState) kubernetesBinaries(context.Context) (string, error) {
	var err error
	if b.kubeFiles, b.m.ContainerImages, err = kubernetesFiles(b.Binaries, b.board.Arch); err != nil {
		return "", err
	}
	var total int64
	var sizes []string
	for _, f := range b.kubeFiles {
		a, err := fileArtefact(f)
		if err != nil {
			return "", err
		}
		b.m.SystemFiles["/"+f.Path] = a
		total += a.Size
		sizes = append(sizes, fmt.Sprintf("%s %s", filepath.Base(f.Path), mib(a.Size)))
	}
	return fmt.Sprintf("%s in all: %s", mib(total), strings.Join(sizes, ", ")), nil
}

// userImages checks the user's OCI archives (Config.OCIArchives) and
// adds them to kubeFiles and the manifest's images.
func (b *buildState) userImages(context.Context) (string, error) {
	if len(b.OCIArchives) == 0 {
		return "none", nil
	}
	taken := map[string]bool{}
	for _, img := range b.m.ContainerImages {
		taken[img.Ref] = true
	}
	files, images, err := userImageFiles(b.OCIArchives, b.board.Arch, b.tmp, taken)
	if err != nil {
		return "", err
	}
	var total int64
	for _, f := range files {
		a, err := fileArtefact(f)
		if err != nil {
			return "", err
		}
		b.m.SystemFiles["/"+f.Path] = a
		total += a.Size
	}
	b.kubeFiles = append(b.kubeFiles, files...)
	b.m.ContainerImages = append(b.m.ContainerImages, images...)
	var refs []string
	for _, img := range images {
		r := img.Ref
		if strings.HasSuffix(r, ":latest") {
			// Kubernetes pulls :latest always unless told otherwise.
			r += " (pods need imagePullPolicy IfNotPresent or Never)"
		}
		refs = append(refs, r)
	}
	archives := "archives"
	if len(files) == 1 {
		archives = "archive"
	}
	return fmt.Sprintf("%s in %d %s: %s", mib(total), len(files), archives, strings.Join(refs, ", ")), nil
}

// conformanceImages adds the conformance tests' archive
// (Config.Conformance) to kubeFiles and the manifest's images.
func (b *buildState) conformanceImages(context.Context) (string, error) {
	testpod, err := os.ReadFile(b.Binaries.Testpod)
	if err != nil {
		return "", err
	}
	f, images, err := conformanceFiles(*b.Conformance, testpod, b.board.Arch)
	if err != nil {
		return "", err
	}
	for _, img := range b.m.ContainerImages {
		for _, c := range images {
			if c.Ref == img.Ref {
				return "", fmt.Errorf("conformance image %s: %s carries it already", c.Ref, img.Archive)
			}
		}
	}
	a, err := fileArtefact(f)
	if err != nil {
		return "", err
	}
	b.m.SystemFiles["/"+f.Path] = a
	b.kubeFiles = append(b.kubeFiles, f)
	b.m.ContainerImages = append(b.m.ContainerImages, images...)
	// And beside the image, for the registry the conformance runner
	// serves them from (the specs that pull always).
	if err := writeFileAtomic(b.out(ConformanceArchive), f.Data); err != nil {
		return "", err
	}
	return fmt.Sprintf("%s: %d images", mib(a.Size), len(images)), nil
}

// systemImage writes SystemFile, the squashfs of the system tree with its
// dm-verity hash tree: sets caCerts, and the manifest's verity parameters
// and the kernel command line that names them.
func (b *buildState) systemImage(ctx context.Context) (string, error) {
	ca := b.CACertificates
	if ca == "" {
		ca = "/etc/ssl/certs/ca-certificates.crt"
	}
	if data, err := os.ReadFile(ca); err == nil {
		b.caCerts = data
	} else if b.CACertificates != "" {
		return "", err
	}
	tree, err := systemTree(b)
	if err != nil {
		return "", err
	}
	sysPath := b.out(SystemFile)
	vp, dataSize, err := buildSquashfs(ctx, b.tmp, sysPath, tree, b.prog)
	if err != nil {
		return "", err
	}
	b.m.Verity = VerityInfo{RootHash: hex.EncodeToString(vp.RootHash), Salt: hex.EncodeToString(vp.Salt),
		DataBlocks: vp.DataBlocks, HashStartBlock: vp.HashStartBlock}
	b.m.Cmdline = strings.Join(append(b.board.KernelCmdline(), "plinth.verity="+vp.String()), " ")
	st, err := os.Stat(sysPath)
	if err != nil {
		return "", err
	}
	return fmt.Sprintf("%s data + %s hash tree, root hash %s", mib(dataSize), mib(st.Size()-dataSize), b.m.Verity.RootHash[:16]), nil
}

// buildInitramfs writes InitramfsFile: the system image, then /init and
// the early modules; sets initramfs and bootInitramfs (the latter alone).
func (b *buildState) buildInitramfs(context.Context) (string, error) {
	initBin, err := os.ReadFile(b.Init)
	if err != nil {
		return "", err
	}
	sys, err := os.ReadFile(b.out(SystemFile))
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
	if err := writeFileAtomic(b.out(InitramfsFile), buf.Bytes()); err != nil {
		return "", err
	}
	b.initramfs, b.bootInitramfs = buf.Bytes(), boot.Bytes()
	return fmt.Sprintf("%s (/init %s, %d modules; %s without the system image)",
		mib(int64(buf.Len())), mib(int64(len(initBin))), len(b.earlyModules), mib(int64(boot.Len()))), nil
}

// writeDiskImage writes DiskFile, slot a's UKI on its ESP and the system
// image in slot a: sets the manifest's disk layout.
func (b *buildState) writeDiskImage(ctx context.Context) (string, error) {
	root, _ := hex.DecodeString(b.m.Verity.RootHash)
	files := []espFile{
		{Path: layout.ESPBootFile, Source: b.out(UKISlotFile("a"))},
		{Path: layout.ESPSlotUKI("a"), Source: b.out(UKISlotFile("a"))},
	}
	var err error
	b.m.Disk, err = writeDisk(ctx, b.tmp, b.out(DiskFile), b.out(SystemFile), files, root)
	if err != nil {
		return "", err
	}
	return fmt.Sprintf("%s: ESP %d MiB, slots a and b %d MiB each (a holds the system image)", mib(b.m.Disk.Size), DiskESPMiB, DiskSlotMiB), nil
}

// writeManifest writes KernelFile and CmdlineFile, hashes every artefact
// into the manifest and writes it (signed with SignKey if set).
func (b *buildState) writeManifest(context.Context) (string, error) {
	if err := writeFileAtomic(b.out(KernelFile), b.kernel.Image); err != nil {
		return "", err
	}
	if err := writeFileAtomic(b.out(CmdlineFile), []byte(b.m.Cmdline+"\n")); err != nil {
		return "", err
	}
	for _, name := range []string{KernelFile, InitramfsFile, SystemFile, CmdlineFile, UKIFile, UKISlotFile("a"), UKISlotFile("b"), DiskFile} {
		a, err := hashFile(b.out(name))
		if err != nil {
			return "", err
		}
		b.m.Artefacts[name] = a
	}
	if err := WriteManifest(b.OutDir, b.m, b.SignKey); err != nil {
		return "", err
	}
	if b.SignKey == nil {
		return b.out(ManifestFile) + ", unsigned", nil
	}
	return fmt.Sprintf("%s, release %d signed by %s", b.out(ManifestFile), b.m.Release, b.m.ReleaseKey[:16]), nil
}
