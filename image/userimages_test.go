package image

import (
	"archive/tar"
	"bytes"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"

	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/mutate"

	"plinth.dev/plinth/internal/testutil/ocitest"
	"plinth.dev/plinth/platform/ociarchive"
)

// testImage is a one-file image for arch.
func testImage(t *testing.T, arch, content string) v1.Image {
	t.Helper()
	img, err := buildOCIImage(containerImage{Ref: "example.org/app:v1", Arch: arch, Entrypoint: []string{"/app"},
		Files: map[string][]byte{"app": []byte(content)}})
	if err != nil {
		t.Fatal(err)
	}
	return img
}

// writeOCITestArchive writes the entries with ocitest (go-containerregistry's
// layout writer) and returns the path.
func writeOCITestArchive(t *testing.T, name string, entries ...ocitest.Entry) string {
	t.Helper()
	p := filepath.Join(t.TempDir(), name)
	if err := ocitest.WriteArchive(p, entries...); err != nil {
		t.Fatal(err)
	}
	return p
}

func refName(r string) map[string]string { return map[string]string{ocitest.RefNameAnnotation: r} }

// tarEntries reads an archive's entries.
func tarEntries(t *testing.T, p string) map[string][]byte {
	t.Helper()
	f, err := os.Open(p)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	out := map[string][]byte{}
	tr := tar.NewReader(f)
	for {
		h, err := tr.Next()
		if err == io.EOF {
			return out
		}
		if err != nil {
			t.Fatal(err)
		}
		b, _ := io.ReadAll(tr)
		out[h.Name] = b
	}
}

// An archive another tool wrote goes into the system image with each
// image named by its normalized reference in containerd's annotation,
// which the node's import reads; its blobs are untouched.
func TestUserImageFiles(t *testing.T) {
	img := testImage(t, "amd64", "one")
	amd, arm := testImage(t, "amd64", "multi"), testImage(t, "arm64", "multi")
	idx := mutate.AppendManifests(empty.Index,
		mutate.IndexAddendum{Add: amd, Descriptor: v1.Descriptor{Platform: &v1.Platform{OS: "linux", Architecture: "amd64"}}},
		mutate.IndexAddendum{Add: arm, Descriptor: v1.Descriptor{Platform: &v1.Platform{OS: "linux", Architecture: "arm64"}}})
	single := writeOCITestArchive(t, "app.tar", ocitest.Entry{Image: img, Annotations: refName("nginx:1.27")})
	multi := writeOCITestArchive(t, "multi.tar", ocitest.Entry{Index: idx, Annotations: refName("registry.example.com:5000/team/multi:v2")})
	tagOnly := writeOCITestArchive(t, "tagged.tar", ocitest.Entry{Image: testImage(t, "amd64", "tag"), Annotations: refName("v3")})

	dir := t.TempDir()
	files, images, err := userImageFiles([]OCIArchive{{Path: single}, {Path: multi}, {Path: tagOnly, Ref: "example.org/tagged:v3"}}, "amd64", dir,
		map[string]bool{"plinth.dev/pause:v1": true})
	if err != nil {
		t.Fatal(err)
	}
	if len(files) != 3 || len(images) != 3 {
		t.Fatalf("got %d files, %d images", len(files), len(images))
	}
	want := map[string]string{
		"docker.io/library/nginx:1.27":            "/usr/share/plinth/images/user-app.tar",
		"registry.example.com:5000/team/multi:v2": "/usr/share/plinth/images/user-multi.tar",
		"example.org/tagged:v3":                   "/usr/share/plinth/images/user-tagged.tar",
	}
	for _, i := range images {
		if want[i.Ref] != i.Archive {
			t.Errorf("image %s in %s, want %q", i.Ref, i.Archive, want[i.Ref])
		}
	}
	for _, f := range files {
		refs, err := ociarchive.Refs(f.Source)
		if err != nil {
			t.Fatal(err)
		}
		if len(refs) != 1 || want[refs[0].Name] != "/"+f.Path {
			t.Errorf("%s names %v for the node's import", f.Path, refs)
		}
	}
	// The multi-platform index is carried whole, its digest the index's.
	mdigest, _ := idx.Digest()
	for _, i := range images {
		if strings.Contains(i.Ref, "multi") && i.Digest != mdigest.String() {
			t.Errorf("multi's digest %s, want the index's %s", i.Digest, mdigest)
		}
	}
	before, after := tarEntries(t, single), tarEntries(t, filepath.Join(dir, "user-app.tar"))
	for name, b := range before {
		if name != "index.json" && !bytes.Equal(b, after[name]) {
			t.Errorf("%s changed in the copy", name)
		}
	}
	if !strings.Contains(string(after["index.json"]), `"org.opencontainers.image.ref.name":"nginx:1.27"`) {
		t.Errorf("the copy's index lost the writer's annotation: %s", after["index.json"])
	}
}

// What the node could not import is refused at build time, naming the
// archive and why.
func TestUserImageFilesRefused(t *testing.T) {
	img := testImage(t, "amd64", "good")
	good := writeOCITestArchive(t, "good.tar", ocitest.Entry{Image: img, Annotations: refName("example.org/good:v1")})
	layer, _ := img.Layers()
	ldigest, _ := layer[0].Digest()

	// corrupt rewrites the archive at p with entry name changed by f.
	corrupt := func(name string, f func(name string, b []byte) ([]byte, bool)) string {
		var buf bytes.Buffer
		tw := tar.NewWriter(&buf)
		for n, b := range tarEntries(t, good) {
			b, keep := f(n, b)
			if !keep {
				continue
			}
			tw.WriteHeader(&tar.Header{Name: n, Mode: 0o644, Size: int64(len(b)), Typeflag: tar.TypeReg})
			tw.Write(b)
		}
		tw.Close()
		p := filepath.Join(t.TempDir(), name)
		if err := os.WriteFile(p, buf.Bytes(), 0o644); err != nil {
			t.Fatal(err)
		}
		return p
	}
	layerPath := "blobs/sha256/" + ldigest.Hex
	for _, c := range []struct {
		name    string
		archive OCIArchive
		arch    string
		taken   string
		want    string
	}{
		{"another architecture", OCIArchive{Path: good}, "arm64", "", "image for linux/amd64, the board runs linux/arm64"},
		{"tag only", OCIArchive{Path: writeOCITestArchive(t, "t.tar", ocitest.Entry{Image: img, Annotations: refName("v1")})}, "amd64", "", "=REFERENCE"},
		{"no name", OCIArchive{Path: writeOCITestArchive(t, "n.tar", ocitest.Entry{Image: img})}, "amd64", "", "has no full reference"},
		{"reference taken", OCIArchive{Path: good}, "amd64", "example.org/good:v1", "already in the image"},
		{"corrupt layer", OCIArchive{Path: corrupt("c.tar", func(n string, b []byte) ([]byte, bool) {
			if n == layerPath {
				b = append([]byte{b[0] ^ 1}, b[1:]...)
			}
			return b, true
		})}, "amd64", "", "the archive is corrupt"},
		{"missing layer", OCIArchive{Path: corrupt("m.tar", func(n string, b []byte) ([]byte, bool) { return b, n != layerPath })}, "amd64", "", "layer " + ldigest.String() + " is not in the archive"},
		{"no oci-layout (docker's old format)", OCIArchive{Path: corrupt("d.tar", func(n string, b []byte) ([]byte, bool) { return b, n != "oci-layout" })}, "amd64", "", "not an OCI image archive"},
		{"not a tar", OCIArchive{Path: func() string {
			p := filepath.Join(t.TempDir(), "x.tar")
			os.WriteFile(p, bytes.Repeat([]byte("not a tar "), 100), 0o644)
			return p
		}()}, "amd64", "", "not a tar archive"},
	} {
		t.Run(c.name, func(t *testing.T) {
			_, _, err := userImageFiles([]OCIArchive{c.archive}, c.arch, t.TempDir(), map[string]bool{c.taken: true})
			if err == nil || !strings.Contains(err.Error(), c.want) || !strings.Contains(err.Error(), c.archive.Path) {
				t.Errorf("got %v, want an error naming %s and saying %q", err, c.archive.Path, c.want)
			}
		})
	}
	if _, _, err := userImageFiles([]OCIArchive{{Path: good}, {Path: good}}, "amd64", t.TempDir(), map[string]bool{}); err == nil || !strings.Contains(err.Error(), "would both be user-good.tar") {
		t.Errorf("the same archive twice: %v", err)
	}
}

func TestParseOCIArchive(t *testing.T) {
	for in, want := range map[string]OCIArchive{"a.tar": {Path: "a.tar"}, "a.tar=nginx:1": {Path: "a.tar", Ref: "nginx:1"}} {
		if got, err := ParseOCIArchive(in); err != nil || got != want {
			t.Errorf("ParseOCIArchive(%q) = %v, %v", in, got, err)
		}
	}
	for _, in := range []string{"", "=nginx:1", "a.tar=Not A Ref"} {
		if _, err := ParseOCIArchive(in); err == nil {
			t.Errorf("ParseOCIArchive(%q) accepted", in)
		}
	}
}
