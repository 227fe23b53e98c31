package image

import (
	"bytes"
	"crypto/sha256"
	"debug/elf"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"sort"
	"strings"

	"plinth.dev/plinth/platform/layout"
	"plinth.dev/plinth/platform/ociarchive"
)

// What a node runs for Kubernetes comes from outside the builder, built
// by `make` from the modules go.mod pins: the multi-call kube binary, the
// container runtime (containerd, its runc shim, and crun, the OCI runtime
// it runs, built from C by scripts/crun), the CNI plugins,
// and testpod, the one program of the node's container images. The
// builder checks each is a static executable for the board's machine (the
// node has no libraries for them), puts them at their layout paths and
// makes the pause and test images from testpod.

// Binaries are the paths of those programs on the build host.
type Binaries struct {
	Kube           string
	Containerd     string
	ContainerdShim string
	OCIRuntime     string
	// CNIDir holds the plugins named in CNIPlugins.
	CNIDir string
	// Testpod is cmd/testpod.
	Testpod string
}

// CNIPlugins are the CNI plugins a node carries in layout.CNIBinDir.
var CNIPlugins = []string{"host-local", "loopback", "portmap", "ptp"}

// BinariesIn names the binaries as `make` builds them into dir (out/bin):
// kube, containerd, containerd-shim-runc-v2, crun, cni/*, testpod.
func BinariesIn(dir string) Binaries {
	return Binaries{
		Kube:           filepath.Join(dir, "kube"),
		Containerd:     filepath.Join(dir, "containerd"),
		ContainerdShim: filepath.Join(dir, "containerd-shim-runc-v2"),
		OCIRuntime:     filepath.Join(dir, "crun"),
		CNIDir:         filepath.Join(dir, "cni"),
		Testpod:        filepath.Join(dir, "testpod"),
	}
}

// placement is where each binary goes in the system image, sorted by
// destination.
func (b Binaries) placement() []struct{ src, dest string } {
	p := []struct{ src, dest string }{
		{b.Kube, layout.KubeBinary},
		{b.Containerd, layout.ContainerdBinary},
		{b.ContainerdShim, layout.ContainerdShimBinary},
		{b.OCIRuntime, layout.OCIRuntimeBinary},
	}
	for _, c := range CNIPlugins {
		p = append(p, struct{ src, dest string }{filepath.Join(b.CNIDir, c), filepath.Join(layout.CNIBinDir, c)})
	}
	sort.Slice(p, func(i, j int) bool { return p[i].dest < p[j].dest })
	return p
}

// elfMachines maps a GOARCH to its ELF machine.
var elfMachines = map[string]elf.Machine{"amd64": elf.EM_X86_64, "arm64": elf.EM_AARCH64}

// checkStaticExecutable refuses what would fail only on the node: not an
// ELF executable, another machine, or a dynamic interpreter.
func checkStaticExecutable(p, arch string) error {
	f, err := elf.Open(p)
	if errors.Is(err, os.ErrNotExist) {
		return fmt.Errorf("%w (make builds it)", err)
	} else if err != nil {
		return fmt.Errorf("%s is not an ELF executable: %v", p, err)
	}
	defer f.Close()
	return checkELF(f, p, arch)
}

func checkELF(f *elf.File, p, arch string) error {
	if want, ok := elfMachines[arch]; !ok {
		return fmt.Errorf("board architecture %q unknown to the builder", arch)
	} else if f.Machine != want {
		return fmt.Errorf("%s is built for %v, the board runs %v (%s)", p, f.Machine, want, arch)
	}
	if f.Type != elf.ET_EXEC && f.Type != elf.ET_DYN {
		return fmt.Errorf("%s is an ELF %v, not an executable", p, f.Type)
	}
	for _, prog := range f.Progs {
		if prog.Type == elf.PT_INTERP {
			return fmt.Errorf("%s is dynamically linked: the node has no libraries for it; link it statically (make does)", p)
		}
	}
	return nil
}

// check refuses, before any work is done, binaries the node could not run.
func (b Binaries) check(arch string) error {
	for _, f := range [][2]string{{"kube", b.Kube}, {"containerd", b.Containerd}, {"containerd shim", b.ContainerdShim},
		{"OCI runtime (crun)", b.OCIRuntime}, {"CNI plugin directory", b.CNIDir}, {"testpod", b.Testpod}} {
		if f[1] == "" {
			return fmt.Errorf("no %s given (plinthctl build --bin DIR; make builds them in out/bin)", f[0])
		}
	}
	for _, p := range append(b.placement(), struct{ src, dest string }{b.Testpod, "the container images"}) {
		if err := checkStaticExecutable(p.src, arch); err != nil {
			return err
		}
	}
	return nil
}

// kubernetesFiles returns the binaries as system image files (copied from
// the host when the image is staged) plus the OCI archives made from
// testpod, and the images those carry.
func kubernetesFiles(bins Binaries, arch string) ([]sysFile, []ContainerImage, error) {
	if err := bins.check(arch); err != nil {
		return nil, nil, err
	}
	var files []sysFile
	var images []ContainerImage
	for _, p := range bins.placement() {
		files = append(files, sysFile{Path: strings.TrimPrefix(p.dest, "/"), Source: p.src, Mode: 0o755})
	}
	testpod, err := os.ReadFile(bins.Testpod)
	if err != nil {
		return nil, nil, err
	}
	for _, img := range []struct {
		file string
		c    containerImage
	}{
		{layout.PauseImageArchive, containerImage{Ref: layout.PauseImage, Entrypoint: []string{"/testpod", "pause"}}},
		{layout.TestImageArchive, containerImage{Ref: layout.TestImage, Entrypoint: []string{"/testpod"}, Cmd: []string{"serve"}}},
	} {
		img.c.Arch = arch
		img.c.Files = map[string][]byte{"testpod": testpod}
		var buf bytes.Buffer
		if err := writeOCIArchive(&buf, img.c); err != nil {
			return nil, nil, fmt.Errorf("container image %s: %w", img.c.Ref, err)
		}
		refs, err := ociarchive.Read(bytes.NewReader(buf.Bytes()))
		if err != nil {
			return nil, nil, err
		}
		archive := filepath.Join(layout.ImagesDir, img.file)
		for _, r := range refs {
			images = append(images, ContainerImage{Ref: r.Name, Digest: r.Digest, Archive: archive})
		}
		files = append(files, sysFile{Path: strings.TrimPrefix(archive, "/"), Data: buf.Bytes(), Mode: 0o644})
	}
	return files, images, nil
}

// moduleLoadList is the text of a load list (kmod.LoadList): paths
// relative to /lib/modules/VERSION, in order.
func moduleLoadList(mods []*Module) []byte {
	var b strings.Builder
	for _, m := range mods {
		b.WriteString(m.Path + "\n")
	}
	return []byte(b.String())
}

// fileArtefact hashes a system image file for the manifest.
func fileArtefact(f sysFile) (Artefact, error) {
	if f.Source == "" {
		sum := sha256.Sum256(f.Data)
		return Artefact{SHA256: hex.EncodeToString(sum[:]), Size: int64(len(f.Data))}, nil
	}
	return hashFile(f.Source)
}

// copyFile streams src to dst (the staged system image tree), so the
// builder never holds the big binaries in memory.
func copyFile(src, dst string, mode os.FileMode) error {
	in, err := os.Open(src)
	if err != nil {
		return err
	}
	defer in.Close()
	out, err := os.OpenFile(dst, os.O_WRONLY|os.O_CREATE|os.O_TRUNC, mode)
	if err != nil {
		return err
	}
	if _, err := io.Copy(out, in); err != nil {
		out.Close()
		return err
	}
	return errors.Join(out.Close(), os.Chmod(dst, mode))
}
