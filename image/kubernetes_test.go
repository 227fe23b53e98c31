package image

import (
	"archive/tar"
	"bytes"
	"debug/elf"
	"encoding/binary"
	"errors"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	v1 "github.com/google/go-containerregistry/pkg/v1"
	ocilayout "github.com/google/go-containerregistry/pkg/v1/layout"
	"github.com/google/go-containerregistry/pkg/v1/types"
	"github.com/google/go-containerregistry/pkg/v1/validate"

	"plinth.dev/plinth/board"
	"plinth.dev/plinth/platform/layout"
	"plinth.dev/plinth/platform/ociarchive"
)

// tinyELF is the smallest file the builder accepts as a program: an ELF
// header and a PT_LOAD (plus PT_INTERP when interp is set, which makes
// it "dynamically linked"), then tag, so that every stand-in differs.
func tinyELF(machine elf.Machine, interp, tag string) []byte {
	nprog := 1
	if interp != "" {
		nprog = 2
	}
	const ehsize, phsize = 64, 56
	dataOff := uint64(ehsize + phsize*nprog)
	var b bytes.Buffer
	h := elf.Header64{Type: uint16(elf.ET_EXEC), Machine: uint16(machine), Version: 1, Entry: 0x400000,
		Phoff: ehsize, Ehsize: ehsize, Phentsize: phsize, Phnum: uint16(nprog)}
	copy(h.Ident[:], elf.ELFMAG)
	h.Ident[elf.EI_CLASS], h.Ident[elf.EI_DATA], h.Ident[elf.EI_VERSION] = byte(elf.ELFCLASS64), byte(elf.ELFDATA2LSB), byte(elf.EV_CURRENT)
	binary.Write(&b, binary.LittleEndian, h)
	size := dataOff + uint64(len(interp)+1+len(tag))
	binary.Write(&b, binary.LittleEndian, elf.Prog64{Type: uint32(elf.PT_LOAD), Flags: uint32(elf.PF_R | elf.PF_X),
		Vaddr: 0x400000, Paddr: 0x400000, Filesz: size, Memsz: size, Align: 0x1000})
	if interp != "" {
		binary.Write(&b, binary.LittleEndian, elf.Prog64{Type: uint32(elf.PT_INTERP), Flags: uint32(elf.PF_R),
			Off: dataOff, Filesz: uint64(len(interp) + 1), Memsz: uint64(len(interp) + 1), Align: 1})
	}
	b.WriteString(interp + "\x00" + tag)
	return b.Bytes()
}

// standInBinaries writes a bin directory as make builds it, each program
// a distinct tiny static ELF, and returns it with each file's content.
func standInBinaries(t *testing.T) (Binaries, map[string][]byte) {
	t.Helper()
	dir := t.TempDir()
	bins := BinariesIn(dir)
	content := map[string][]byte{}
	for _, p := range append(bins.placement(), struct{ src, dest string }{bins.Testpod, "testpod"}) {
		data := tinyELF(elf.EM_X86_64, "", "stand-in for "+p.dest)
		if err := os.MkdirAll(filepath.Dir(p.src), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(p.src, data, 0o755); err != nil {
			t.Fatal(err)
		}
		content[p.dest] = data
	}
	return bins, content
}

// readOCIArchive unpacks an archive and reads its one image with
// go-containerregistry, validating every digest, size and diff ID.
func readOCIArchive(t *testing.T, archive []byte) (v1.Image, v1.Descriptor) {
	t.Helper()
	imgs, descs := readOCIArchiveImages(t, archive)
	if len(imgs) != 1 {
		t.Fatalf("index lists %d manifests, want 1", len(imgs))
	}
	return imgs[0], descs[0]
}

// readOCIArchiveImages reads every image of an archive, in index order,
// validating each.
func readOCIArchiveImages(t *testing.T, archive []byte) ([]v1.Image, []v1.Descriptor) {
	t.Helper()
	dir := t.TempDir()
	tr := tar.NewReader(bytes.NewReader(archive))
	for {
		h, err := tr.Next()
		if err == io.EOF {
			break
		}
		if err != nil {
			t.Fatal(err)
		}
		p := filepath.Join(dir, h.Name)
		if h.Typeflag == tar.TypeDir {
			os.MkdirAll(p, 0o755)
			continue
		}
		data, _ := io.ReadAll(tr)
		if err := os.WriteFile(p, data, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	idx, err := ocilayout.ImageIndexFromPath(dir)
	if err != nil {
		t.Fatal(err)
	}
	im, err := idx.IndexManifest()
	if err != nil {
		t.Fatal(err)
	}
	var imgs []v1.Image
	for _, d := range im.Manifests {
		img, err := idx.Image(d.Digest)
		if err != nil {
			t.Fatal(err)
		}
		if err := validate.Image(img); err != nil {
			t.Fatalf("image %s does not validate: %v", d.Annotations[annotationContainerdName], err)
		}
		imgs = append(imgs, img)
	}
	return imgs, im.Manifests
}

// checkOCIImage checks what the node's runtime relies on: name, platform,
// entrypoint and a single layer holding just /testpod.
func checkOCIImage(t *testing.T, archive []byte, ref, tag string, entrypoint, cmd []string, testpod []byte) {
	t.Helper()
	img, desc := readOCIArchive(t, archive)
	if desc.Annotations[annotationContainerdName] != ref || desc.Annotations[annotationOCIRefName] != tag {
		t.Errorf("%s: index annotations %v", ref, desc.Annotations)
	}
	if desc.Platform == nil || desc.Platform.OS != "linux" || desc.Platform.Architecture != "amd64" {
		t.Errorf("%s: index platform %+v", ref, desc.Platform)
	}
	if mt, _ := img.MediaType(); mt != types.OCIManifestSchema1 {
		t.Errorf("%s: manifest media type %s", ref, mt)
	}
	cfg, err := img.ConfigFile()
	if err != nil {
		t.Fatal(err)
	}
	if cfg.OS != "linux" || cfg.Architecture != "amd64" || !slices.Equal(cfg.Config.Entrypoint, entrypoint) || !slices.Equal(cfg.Config.Cmd, cmd) {
		t.Errorf("%s: config %s/%s entrypoint %q cmd %q", ref, cfg.OS, cfg.Architecture, cfg.Config.Entrypoint, cfg.Config.Cmd)
	}
	if !cfg.Created.Time.Equal(ociEpoch) {
		t.Errorf("%s: created %v, want the fixed epoch", ref, cfg.Created)
	}
	layers, err := img.Layers()
	if err != nil || len(layers) != 1 {
		t.Fatalf("%s: %d layers (%v), want 1", ref, len(layers), err)
	}
	if mt, _ := layers[0].MediaType(); mt != types.OCILayer {
		t.Errorf("%s: layer media type %s", ref, mt)
	}
	rc, err := layers[0].Uncompressed()
	if err != nil {
		t.Fatal(err)
	}
	defer rc.Close()
	tr := tar.NewReader(rc)
	var names []string
	for {
		h, err := tr.Next()
		if err == io.EOF {
			break
		}
		if err != nil {
			t.Fatal(err)
		}
		names = append(names, h.Name)
		data, _ := io.ReadAll(tr)
		if h.Name == "testpod" && (h.Mode != 0o755 || h.Uid != 0 || !bytes.Equal(data, testpod)) {
			t.Errorf("%s: /testpod mode %o uid %d, %d bytes (want %d)", ref, h.Mode, h.Uid, len(data), len(testpod))
		}
	}
	if !slices.Equal(names, []string{"testpod"}) {
		t.Errorf("%s: layer holds %v, want just testpod", ref, names)
	}
}

func TestOCIArchives(t *testing.T) {
	prog := tinyELF(elf.EM_X86_64, "", "testpod")
	write := func(c containerImage) []byte {
		var buf bytes.Buffer
		if err := writeOCIArchive(&buf, c); err != nil {
			t.Fatal(err)
		}
		return buf.Bytes()
	}
	pause := containerImage{Ref: layout.PauseImage, Arch: "amd64", Entrypoint: []string{"/testpod", "pause"}, Files: map[string][]byte{"testpod": prog}}
	a := write(pause)
	checkOCIImage(t, a, layout.PauseImage, "v1", []string{"/testpod", "pause"}, nil, prog)
	test := containerImage{Ref: layout.TestImage, Arch: "amd64", Entrypoint: []string{"/testpod"}, Cmd: []string{"serve"}, Files: map[string][]byte{"testpod": prog}}
	checkOCIImage(t, write(test), layout.TestImage, "v1", []string{"/testpod"}, []string{"serve"}, prog)

	// Same input, same bytes; another program, another archive.
	if !bytes.Equal(a, write(pause)) {
		t.Error("two archives of the same image differ")
	}
	pause.Files = map[string][]byte{"testpod": tinyELF(elf.EM_X86_64, "", "other")}
	if bytes.Equal(a, write(pause)) {
		t.Error("another program gave the same archive")
	}
	// containerd's importer reads oci-layout, index.json and blobs/…
	// from the tar: nothing else, no absolute or parent paths.
	tr := tar.NewReader(bytes.NewReader(a))
	for {
		h, err := tr.Next()
		if err == io.EOF {
			break
		}
		if h.Name != "oci-layout" && h.Name != "index.json" && !strings.HasPrefix(h.Name, "blobs/") {
			t.Errorf("unexpected archive entry %q", h.Name)
		}
		if !h.ModTime.Equal(ociEpoch) || h.Uid != 0 || h.Gid != 0 {
			t.Errorf("%s: time %v owner %d:%d", h.Name, h.ModTime, h.Uid, h.Gid)
		}
	}
	// The worker's import reads the image's name and digest from it
	// without its blobs (ociarchive), to import once per image version.
	ap := filepath.Join(t.TempDir(), "pause.tar")
	os.WriteFile(ap, a, 0o644)
	if refs, err := ociarchive.Refs(ap); err != nil || len(refs) != 1 || refs[0].Name != layout.PauseImage || !strings.HasPrefix(refs[0].Digest, "sha256:") {
		t.Errorf("ociarchive.Refs of the pause archive: %v, %v", refs, err)
	}
	if err := writeOCIArchive(io.Discard, containerImage{Ref: "untagged", Arch: "amd64", Entrypoint: []string{"/x"}}); err == nil {
		t.Error("an untagged reference was accepted")
	}
}

func TestBinariesChecked(t *testing.T) {
	bins, _ := standInBinaries(t)
	b := must(board.Get(board.Default))
	if err := bins.check(b.Arch); err != nil {
		t.Fatalf("stand-ins refused: %v", err)
	}
	for _, c := range []struct {
		name, want string
		data       []byte
	}{
		{"dynamic", "dynamically linked", tinyELF(elf.EM_X86_64, "/lib64/ld-linux-x86-64.so.2", "crun")},
		{"other machine", "built for EM_AARCH64", tinyELF(elf.EM_AARCH64, "", "crun")},
		{"not ELF", "not an ELF executable", []byte("#!/bin/sh\n")},
	} {
		if err := os.WriteFile(bins.OCIRuntime, c.data, 0o755); err != nil {
			t.Fatal(err)
		}
		err := bins.check(b.Arch)
		if err == nil || !strings.Contains(err.Error(), c.want) || !strings.Contains(err.Error(), bins.OCIRuntime) {
			t.Errorf("%s crun: %v, want an error naming it and %q", c.name, err, c.want)
		}
	}
	os.WriteFile(bins.OCIRuntime, tinyELF(elf.EM_X86_64, "", "crun"), 0o755)
	os.Remove(filepath.Join(bins.CNIDir, "ptp"))
	if err := bins.check(b.Arch); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("missing ptp: %v", err)
	}
	if err := (Binaries{}).check(b.Arch); err == nil || !strings.Contains(err.Error(), "--bin") {
		t.Errorf("no binaries: %v", err)
	}
	// Build refuses them before reading anything.
	_, err := Build(t.Context(), Config{Board: b, KernelPackage: "/nonexistent.deb", Init: "/nonexistent", Binaries: bins, OutDir: t.TempDir()})
	if err == nil || !strings.Contains(err.Error(), "ptp") {
		t.Errorf("Build with a missing plugin: %v", err)
	}
}

// checkKubernetesContents checks the system image of a build made with
// standInBinaries: every program at its layout path, mode 0755, the
// container images, nft with its libraries, the module load list.
func checkKubernetesContents(t *testing.T, m *Manifest, sysImage string, content map[string][]byte) {
	t.Helper()
	root := filepath.Join(t.TempDir(), "root")
	if msg, err := exec.Command("unsquashfs", "-no-progress", "-d", root, sysImage).CombinedOutput(); err != nil {
		t.Fatalf("unsquashfs: %v: %s", err, msg)
	}
	for dest, want := range content {
		if dest == "testpod" {
			continue
		}
		p := filepath.Join(root, dest)
		st, err := os.Stat(p)
		if err != nil {
			t.Errorf("%s missing: %v", dest, err)
			continue
		}
		got, _ := os.ReadFile(p)
		if st.Mode() != 0o755 || !bytes.Equal(got, want) {
			t.Errorf("%s: mode %v, content right: %v", dest, st.Mode(), bytes.Equal(got, want))
		}
		if a := m.SystemFiles[dest]; a.Size != int64(len(want)) {
			t.Errorf("manifest system_files[%s] = %+v", dest, a)
		}
	}
	for _, name := range CNIPlugins {
		if _, ok := content[filepath.Join(layout.CNIBinDir, name)]; !ok {
			t.Errorf("CNI plugin %s not placed", name)
		}
	}
	// Every image the manifest lists is in the system image under its
	// name: the node's own, and the user's (TestBuildContentsAndManifest
	// adds one).
	want := map[string]string{layout.PauseImage: filepath.Join(layout.ImagesDir, layout.PauseImageArchive),
		layout.TestImage: filepath.Join(layout.ImagesDir, layout.TestImageArchive), "docker.io/library/app:1.0": filepath.Join(layout.ImagesDir, "user-app.tar")}
	for _, img := range m.ContainerImages {
		if want[img.Ref] != img.Archive {
			t.Errorf("manifest: image %s in %s, want %q", img.Ref, img.Archive, want[img.Ref])
		}
		delete(want, img.Ref)
		data, err := os.ReadFile(filepath.Join(root, img.Archive))
		if err != nil {
			t.Fatal(err)
		}
		_, desc := readOCIArchive(t, data)
		if desc.Annotations[annotationContainerdName] != img.Ref || desc.Digest.String() != img.Digest {
			t.Errorf("%s names %v %s, the manifest %s %s", img.Archive, desc.Annotations, desc.Digest, img.Ref, img.Digest)
		}
		if m.SystemFiles[img.Archive].Size != int64(len(data)) {
			t.Errorf("manifest system_files[%s] = %+v, file has %d bytes", img.Archive, m.SystemFiles[img.Archive], len(data))
		}
	}
	if len(want) != 0 {
		t.Errorf("images not in the manifest: %v", want)
	}
	checkOCIImage(t, must(os.ReadFile(filepath.Join(root, layout.ImagesDir, layout.TestImageArchive))),
		layout.TestImage, "v1", []string{"/testpod"}, []string{"serve"}, content["testpod"])

	// nft and its shared libraries, as mkfs is carried.
	if st, err := os.Stat(filepath.Join(root, layout.NftBinary)); err != nil || st.Mode() != 0o755 {
		t.Errorf("nft: %v %v", st, err)
	}
	if _, err := os.Stat(filepath.Join(root, "lib/x86_64-linux-gnu/libnftables.so.1")); err != nil {
		t.Errorf("nft's library: %v", err)
	}

	// The module load list: in dependency order, every file present,
	// nothing that boot loads already (it is not in the system image).
	list, err := os.ReadFile(filepath.Join(root, layout.KubernetesModuleLoadList))
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, rel := range strings.Fields(string(list)) {
		if _, err := os.Stat(filepath.Join(root, "lib/modules", m.KernelVersion, rel)); err != nil {
			t.Errorf("load list entry %s: %v", rel, err)
		}
		names = append(names, moduleName(filepath.Base(rel)))
	}
	if !slices.Equal(names, m.KubernetesModules) {
		t.Errorf("load list %v, manifest %v", names, m.KubernetesModules)
	}
	b := must(board.Get(board.Default))
	for _, want := range b.KubernetesModules {
		if !slices.Contains(names, want) {
			t.Errorf("%s missing from the Kubernetes load list", want)
		}
	}
	pos := func(n string) int { return slices.Index(names, n) }
	for _, pair := range [][2]string{{"nf_tables", "nft_ct"}, {"nfnetlink", "nf_tables"}, {"nf_conntrack", "nf_nat"}, {"nf_nat", "nft_chain_nat"}, {"bridge", "br_netfilter"}} {
		if pos(pair[0]) < 0 || pos(pair[0]) > pos(pair[1]) {
			t.Errorf("%s must come before %s in %v", pair[0], pair[1], names)
		}
	}
	for _, e := range m.EarlyModules {
		if slices.Contains(names, e) {
			t.Errorf("early module %s in the Kubernetes load list", e)
		}
	}
}
