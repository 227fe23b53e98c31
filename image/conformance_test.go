package image

import (
	"archive/tar"
	"bytes"
	"debug/elf"
	"io"
	"os"
	"path"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	imageutils "k8s.io/kubernetes/test/utils/image"
)

// standInConformance writes the inputs as make conformance builds them,
// each program a distinct tiny static ELF.
func standInConformance(t *testing.T) (ConformanceInputs, map[string][]byte) {
	t.Helper()
	dir := t.TempDir()
	content := map[string][]byte{}
	for _, n := range []string{"agnhost", "e2etools", "e2eservers", "nnp", "localhost.crt", "localhost.key",
		"kitten/kitten.jpg", "kitten/data.json", "nautilus/nautilus.jpg", "nautilus/data.json", "busybox"} {
		b := []byte("data of " + n)
		if !strings.Contains(n, ".") {
			b = tinyELF(elf.EM_X86_64, "", "stand-in for "+n)
		}
		os.MkdirAll(filepath.Dir(filepath.Join(dir, n)), 0o755)
		if err := os.WriteFile(filepath.Join(dir, n), b, 0o755); err != nil {
			t.Fatal(err)
		}
		content[n] = b
	}
	return ConformanceInputs{Dir: dir}, content
}

// walk calls fn for every entry of an image's file system as containerd
// unpacks it: every layer in order (no whiteouts are written); the
// reader is the entry's content.
func walk(t *testing.T, img v1.Image, fn func(h *tar.Header, r io.Reader)) {
	t.Helper()
	rc := mutate.Extract(img)
	defer rc.Close()
	tr := tar.NewReader(rc)
	for {
		h, err := tr.Next()
		if err == io.EOF {
			return
		}
		if err != nil {
			t.Fatal(err)
		}
		fn(h, tr)
	}
}

// flatten is an image's file system's entries by path.
func flatten(t *testing.T, img v1.Image) map[string]*tar.Header {
	t.Helper()
	fs := map[string]*tar.Header{}
	walk(t, img, func(h *tar.Header, _ io.Reader) { fs[strings.TrimSuffix(h.Name, "/")] = h })
	return fs
}

// fileIn is the content of the regular file at path in img (nil: none).
func fileIn(t *testing.T, img v1.Image, path string) []byte {
	t.Helper()
	var out []byte
	walk(t, img, func(h *tar.Header, r io.Reader) {
		if h.Name == path && h.Typeflag == tar.TypeReg {
			b, err := io.ReadAll(r)
			if err != nil {
				t.Fatal(err)
			}
			out = b
		}
	})
	return out
}

func TestConformanceImages(t *testing.T) {
	in, content := standInConformance(t)
	testpod := tinyELF(elf.EM_X86_64, "", "testpod")
	f, carried, err := conformanceFiles(in, testpod, "amd64")
	if err != nil {
		t.Fatal(err)
	}
	if f.Path != "usr/share/plinth/images/"+ConformanceArchive {
		t.Errorf("archive at %s", f.Path)
	}
	imgs, descs := readOCIArchiveImages(t, f.Data)
	if len(imgs) != len(ConformanceImages) || len(carried) != len(ConformanceImages) {
		t.Fatalf("%d images in the archive, %d in the manifest, %d in the table", len(imgs), len(carried), len(ConformanceImages))
	}
	// The references are upstream's own, for this Kubernetes version
	// (the suite's image manifest, test/utils/image).
	upstream := map[string]bool{imageutils.GetPauseImageName(): true}
	for _, id := range []imageutils.ImageID{imageutils.Agnhost, imageutils.AgnhostPrev, imageutils.BusyBox, imageutils.Nginx,
		imageutils.NginxNew, imageutils.GlibcDnsTesting, imageutils.Kitten, imageutils.Nautilus, imageutils.Nonewprivs,
		imageutils.NonRoot, imageutils.Etcd, imageutils.APIServer} {
		upstream[imageutils.GetE2EImage(id)] = true
	}
	byRef := map[string]v1.Image{}
	for i, d := range descs {
		ref := d.Annotations[annotationContainerdName]
		byRef[ref] = imgs[i]
		if carried[i].Ref != ref || carried[i].Digest != d.Digest.String() {
			t.Errorf("manifest entry %v, archive has %s %s", carried[i], ref, d.Digest)
		}
		delete(upstream, ref)
	}
	for r := range upstream {
		t.Errorf("the suite uses %s: no image for it", r)
	}

	agnhost := flatten(t, byRef[e2eImages+"agnhost:2.66.1"])
	for p, want := range map[string]string{"bin/sh": "busybox", "bin/mv": "busybox", "agnhost-2": "agnhost",
		"usr/bin/curl": "e2etools", "usr/bin/nc": "e2etools", "usr/bin/dig": "e2etools", "usr/bin/getent": "e2etools"} {
		if h := agnhost[p]; h == nil || h.Typeflag != tar.TypeSymlink || h.Linkname != want {
			t.Errorf("agnhost image: %s is %+v, want a link to %s", p, h, want)
		}
	}
	for p, want := range map[string][]byte{"agnhost": content["agnhost"], "bin/busybox": content["busybox"],
		"usr/bin/e2etools": content["e2etools"], "localhost.crt": content["localhost.crt"]} {
		if h := agnhost[p]; h == nil || h.Size != int64(len(want)) {
			t.Errorf("agnhost image: %s is %+v, want %d bytes", p, h, len(want))
		}
	}
	if h := agnhost["usr/bin/e2eservers"]; h != nil {
		t.Errorf("agnhost image: carries e2eservers (%+v), which only the etcd and sample API server images run", h)
	}
	if h := agnhost["bin/nc"]; h != nil {
		t.Errorf("agnhost image: /bin/nc is %+v: busybox's nc would shadow e2etools' for a command named by path", h)
	}
	if h := agnhost["tmp"]; h == nil || h.Typeflag != tar.TypeDir || h.Mode != 0o1777 {
		t.Errorf("agnhost image: /tmp is %+v, want a sticky world-writable directory", h)
	}
	if h := flatten(t, byRef[e2eImages+"nonewprivs:1.4"])["usr/local/bin/nnp"]; h == nil || h.Mode != 0o4755 {
		t.Errorf("nonewprivs image: nnp is %+v, want setuid root", h)
	}
	for ref, p := range map[string]string{coreImages + "etcd:3.7.0-0": "usr/local/bin/etcd", e2eImages + "sample-apiserver:1.29.2": "sample-apiserver"} {
		fs := flatten(t, byRef[ref])
		if h := fs[p]; h == nil || path.Join(path.Dir(p), h.Linkname) != "usr/bin/e2eservers" {
			t.Errorf("%s: /%s is %+v, want a link to /usr/bin/e2eservers", ref, p, h)
		}
		if h := fs["usr/bin/e2eservers"]; h == nil || h.Size != int64(len(content["e2eservers"])) {
			t.Errorf("%s: /usr/bin/e2eservers is %+v", ref, h)
		}
	}
	if h := flatten(t, byRef[e2eImages+"kitten:1.8"])["kitten.jpg"]; h == nil || h.Size != int64(len(content["kitten/kitten.jpg"])) {
		t.Errorf("kitten image: kitten.jpg is %+v", h)
	}
	// The ImageVolume spec mounts the kitten image and reads both.
	if b := fileIn(t, byRef[e2eImages+"kitten:1.8"], "etc/os-release"); !strings.Contains(string(b), "Alpine Linux") {
		t.Errorf("kitten image: /etc/os-release is %q, the ImageVolume spec looks for Alpine Linux", b)
	}
	if b := fileIn(t, byRef[e2eImages+"kitten:1.8"], "data.json"); !bytes.Equal(b, content["kitten/data.json"]) {
		t.Errorf("kitten image: data.json is %q", b)
	}
	for ref, want := range map[string]struct {
		entrypoint, cmd []string
		user            string
	}{
		e2eImages + "agnhost:2.66.1":   {[]string{"/agnhost"}, []string{"pause"}, ""},
		e2eImages + "nonroot:1.5":      {nil, []string{"sh"}, "1234"},
		coreImages + "pause:3.10.2":    {[]string{"/pause", "pause"}, nil, ""},
		e2eImages + "nginx:1.27.0-2":   {nil, []string{"/bin/busybox", "httpd", "-f", "-p", "80", "-h", "/usr/share/nginx/html"}, ""},
		e2eImages + "busybox:1.37.0-2": {nil, []string{"sh"}, ""},
	} {
		cfg, err := byRef[ref].ConfigFile()
		if err != nil {
			t.Fatal(err)
		}
		if !slices.Equal(cfg.Config.Entrypoint, want.entrypoint) || !slices.Equal(cfg.Config.Cmd, want.cmd) || cfg.Config.User != want.user ||
			!slices.Contains(cfg.Config.Env, conformPATH) {
			t.Errorf("%s: config %+v", ref, cfg.Config)
		}
	}
	// Images share their layers: the archive holds agnhost's once.
	if n := bytes.Count(f.Data, []byte("stand-in for agnhost")); n != 0 {
		t.Errorf("agnhost uncompressed in the archive %d times", n)
	}
	blobs := map[string]bool{}
	for _, img := range imgs {
		ls, _ := img.Layers()
		for _, l := range ls {
			d, _ := l.Digest()
			blobs[d.String()] = true
		}
	}
	if len(blobs) != 9 {
		t.Errorf("%d distinct layers, want 9 (busybox, tools, servers, agnhost, nginx, kitten, nautilus, nnp, pause)", len(blobs))
	}

	// The same inputs give the same archive.
	again, _, err := conformanceFiles(in, testpod, "amd64")
	if err != nil || !bytes.Equal(again.Data, f.Data) {
		t.Errorf("a second build differs (%v)", err)
	}
}

func TestConformanceImagesRefused(t *testing.T) {
	testpod := tinyELF(elf.EM_X86_64, "", "testpod")
	for name, change := range map[string]func(t *testing.T, in *ConformanceInputs){
		"agnhost missing":    func(t *testing.T, in *ConformanceInputs) { os.Remove(filepath.Join(in.Dir, "agnhost")) },
		"e2eservers missing": func(t *testing.T, in *ConformanceInputs) { os.Remove(filepath.Join(in.Dir, "e2eservers")) },
		"e2etools dynamic": func(t *testing.T, in *ConformanceInputs) {
			os.WriteFile(filepath.Join(in.Dir, "e2etools"), tinyELF(elf.EM_X86_64, "/lib64/ld-linux-x86-64.so.2", "x"), 0o755)
		},
		"nnp for another machine": func(t *testing.T, in *ConformanceInputs) {
			os.WriteFile(filepath.Join(in.Dir, "nnp"), tinyELF(elf.EM_AARCH64, "", "x"), 0o755)
		},
		"busybox missing": func(t *testing.T, in *ConformanceInputs) { os.Remove(filepath.Join(in.Dir, "busybox")) },
		"busybox dynamic (a distribution's, not scripts/busybox's)": func(t *testing.T, in *ConformanceInputs) {
			os.WriteFile(filepath.Join(in.Dir, "busybox"), tinyELF(elf.EM_X86_64, "/lib64/ld-linux-x86-64.so.2", "busybox"), 0o755)
		},
		"kitten data missing": func(t *testing.T, in *ConformanceInputs) { os.Remove(filepath.Join(in.Dir, "kitten/data.json")) },
	} {
		t.Run(name, func(t *testing.T) {
			in, _ := standInConformance(t)
			change(t, &in)
			if _, _, err := conformanceFiles(in, testpod, "amd64"); err == nil || !strings.Contains(err.Error(), "conformance images") {
				t.Errorf("accepted, or an unclear error: %v", err)
			}
		})
	}
}
