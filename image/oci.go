package image

import (
	"archive/tar"
	"bytes"
	"compress/gzip"
	"encoding/json"
	"fmt"
	"io"
	"path"
	"sort"
	"strings"
	"time"

	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/tarball"
	"github.com/google/go-containerregistry/pkg/v1/types"

	"plinth.dev/plinth/platform/layout"
	"plinth.dev/plinth/platform/ociarchive"
)

// Container images without a registry: nodes cannot pull, so the builder
// writes the images a node needs (the pod sandbox and the test workload)
// as OCI image layout archives into the system image, where the
// Kubernetes runtime imports them into containerd. Each image is one
// layer holding one static program; every timestamp is fixed and every
// entry sorted, so the same program gives the same archive.
//
//	archive.tar
//	  oci-layout                 {"imageLayoutVersion": "1.0.0"}
//	  index.json                 one manifest, annotated with the image's name
//	  blobs/sha256/<manifest>    OCI manifest
//	  blobs/sha256/<config>      OCI config: linux/ARCH, entrypoint, cmd
//	  blobs/sha256/<layer>       gzip tar: the program
//
// The index annotations are the ones containerd's own exporter writes and
// its importer (`ctr image import`, client.Import) reads:
// io.containerd.image.name is the full reference, which names the image;
// org.opencontainers.image.ref.name is its tag, as the OCI spec asks.

// ociEpoch is every timestamp in an image: config, history, layer entries.
var ociEpoch = time.Unix(0, 0).UTC()

// containerImage describes one image to build.
type containerImage struct {
	Ref        string // e.g. layout.PauseImage
	Arch       string // GOARCH
	Entrypoint []string
	Cmd        []string
	// Files are the layer's contents: path (relative) → content, all
	// regular files with mode 0755.
	Files map[string][]byte
}

// annotation keys of the index entry.
const (
	annotationContainerdName = ociarchive.NameAnnotation
	annotationOCIRefName     = "org.opencontainers.image.ref.name"
)

// writeOCIArchive writes c as an OCI image layout tar to w.
func writeOCIArchive(w io.Writer, c containerImage) error {
	img, err := buildOCIImage(c)
	if err != nil {
		return err
	}
	manifest, err := img.RawManifest()
	if err != nil {
		return err
	}
	mdigest, err := img.Digest()
	if err != nil {
		return err
	}
	config, err := img.RawConfigFile()
	if err != nil {
		return err
	}
	cdigest, err := img.ConfigName()
	if err != nil {
		return err
	}
	blobs := map[string][]byte{blobPath(mdigest): manifest, blobPath(cdigest): config}
	layers, err := img.Layers()
	if err != nil {
		return err
	}
	for _, l := range layers {
		d, err := l.Digest()
		if err != nil {
			return err
		}
		rc, err := l.Compressed()
		if err != nil {
			return err
		}
		data, err := io.ReadAll(rc)
		rc.Close()
		if err != nil {
			return err
		}
		blobs[blobPath(d)] = data
	}
	tag := c.Ref[strings.LastIndex(c.Ref, ":")+1:]
	index := v1.IndexManifest{
		SchemaVersion: 2,
		MediaType:     types.OCIImageIndex,
		Manifests: []v1.Descriptor{{
			MediaType:   types.OCIManifestSchema1,
			Size:        int64(len(manifest)),
			Digest:      mdigest,
			Platform:    &v1.Platform{OS: "linux", Architecture: c.Arch},
			Annotations: map[string]string{annotationContainerdName: c.Ref, annotationOCIRefName: tag},
		}},
	}
	indexJSON, err := json.Marshal(index)
	if err != nil {
		return err
	}
	files := map[string][]byte{
		"oci-layout": []byte(`{"imageLayoutVersion":"1.0.0"}`),
		"index.json": indexJSON,
	}
	for p, b := range blobs {
		files[p] = b
	}
	return writeTar(w, files, []string{"blobs", "blobs/sha256"}, 0o644)
}

func blobPath(h v1.Hash) string { return path.Join("blobs", h.Algorithm, h.Hex) }

// buildOCIImage makes the image: one gzip layer, an OCI config for
// linux/Arch with fixed timestamps.
func buildOCIImage(c containerImage) (v1.Image, error) {
	if !strings.Contains(c.Ref, ":") || c.Arch == "" || len(c.Entrypoint) == 0 {
		return nil, fmt.Errorf("container image %q: a tagged reference, an architecture and an entrypoint are required", c.Ref)
	}
	var layerTar bytes.Buffer
	if err := writeTar(&layerTar, c.Files, nil, 0o755); err != nil {
		return nil, err
	}
	layer, err := tarball.LayerFromOpener(func() (io.ReadCloser, error) {
		return io.NopCloser(bytes.NewReader(layerTar.Bytes())), nil
	}, tarball.WithMediaType(types.OCILayer), tarball.WithCompressionLevel(gzip.DefaultCompression))
	if err != nil {
		return nil, err
	}
	img := mutate.MediaType(empty.Image, types.OCIManifestSchema1)
	img = mutate.ConfigMediaType(img, types.OCIConfigJSON)
	img, err = mutate.Append(img, mutate.Addendum{
		Layer:     layer,
		MediaType: types.OCILayer,
		History:   v1.History{Created: v1.Time{Time: ociEpoch}, CreatedBy: "plinth image builder", Comment: c.Ref},
	})
	if err != nil {
		return nil, err
	}
	cfg, err := img.ConfigFile()
	if err != nil {
		return nil, err
	}
	cfg = cfg.DeepCopy()
	cfg.Architecture, cfg.OS = c.Arch, "linux"
	cfg.Created = v1.Time{Time: ociEpoch}
	cfg.Config = v1.Config{
		Entrypoint: c.Entrypoint,
		Cmd:        c.Cmd,
		Env:        []string{"PATH=/"},
		WorkingDir: "/",
	}
	return mutate.ConfigFile(img, cfg)
}

// writeTar writes files (sorted, owner 0:0, fixed time) after the given
// directories.
func writeTar(w io.Writer, files map[string][]byte, dirs []string, mode int64) error {
	tw := tar.NewWriter(w)
	for _, d := range dirs {
		if err := tw.WriteHeader(&tar.Header{Typeflag: tar.TypeDir, Name: d + "/", Mode: 0o755, ModTime: ociEpoch, Format: tar.FormatPAX}); err != nil {
			return err
		}
	}
	names := make([]string, 0, len(files))
	for n := range files {
		names = append(names, n)
	}
	sort.Strings(names)
	for _, n := range names {
		data := files[n]
		h := &tar.Header{Typeflag: tar.TypeReg, Name: n, Mode: mode, Size: int64(len(data)), ModTime: ociEpoch, Format: tar.FormatPAX}
		if err := tw.WriteHeader(h); err != nil {
			return err
		}
		if _, err := tw.Write(data); err != nil {
			return err
		}
	}
	return tw.Close()
}

// TestPodImage is the test workload's image (layout.TestImage) as the
// builder writes it into the system image, for a registry to serve it
// (the VM tests' pulls).
func TestPodImage(testpod []byte, arch string) (v1.Image, error) {
	return buildOCIImage(containerImage{Ref: layout.TestImage, Arch: arch, Entrypoint: []string{"/testpod"}, Cmd: []string{"serve"},
		Files: map[string][]byte{"testpod": testpod}})
}
