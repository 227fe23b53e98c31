package image

import (
	"archive/tar"
	"bytes"
	"compress/gzip"
	"encoding/json"
	"fmt"
	"io"
	"path"
	"slices"
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
// Kubernetes runtime imports them into containerd. The pause and test
// images are one layer holding one static program; the conformance
// images (conformance.go) share layers made by newLayer within one
// archive. Every timestamp is fixed and every entry sorted, so the same
// programs give the same archive.
//
//	archive.tar
//	  oci-layout                 {"imageLayoutVersion": "1.0.0"}
//	  index.json                 one manifest per image, annotated with its name
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
	// Env is the configuration's environment (default PATH=/), User its
	// user ("": root) and WorkingDir its directory (default /).
	Env        []string
	User       string
	WorkingDir string
	// Layers are layers made by newLayer, bottom first, which images of
	// one archive share (conformance.go).
	Layers []v1.Layer
	// Files are a last layer's contents: path (relative) → content, all
	// regular files with mode 0755.
	Files map[string][]byte
}

// annotation keys of the index entry.
const (
	annotationContainerdName = ociarchive.NameAnnotation
	annotationOCIRefName     = "org.opencontainers.image.ref.name"
)

// writeOCIArchive writes the images as one OCI image layout tar to w:
// one index entry per image, each blob once (images share layers). The
// index comes first, so a reader of the names (ociarchive.Read) stops
// before the blobs.
func writeOCIArchive(w io.Writer, images ...containerImage) error {
	blobs := map[string][]byte{}
	index := v1.IndexManifest{SchemaVersion: 2, MediaType: types.OCIImageIndex}
	for _, c := range images {
		d, err := addImageBlobs(blobs, c)
		if err != nil {
			return err
		}
		index.Manifests = append(index.Manifests, d)
	}
	indexJSON, err := json.Marshal(index)
	if err != nil {
		return err
	}
	tw := tar.NewWriter(w)
	if err := writeTarFiles(tw, map[string][]byte{
		"oci-layout": []byte(`{"imageLayoutVersion":"1.0.0"}`),
		"index.json": indexJSON,
	}, 0o644); err != nil {
		return err
	}
	for _, d := range []string{"blobs", "blobs/sha256"} {
		if err := tw.WriteHeader(&tar.Header{Typeflag: tar.TypeDir, Name: d + "/", Mode: 0o755, ModTime: ociEpoch, Format: tar.FormatPAX}); err != nil {
			return err
		}
	}
	if err := writeTarFiles(tw, blobs, 0o644); err != nil {
		return err
	}
	return tw.Close()
}

// addImageBlobs builds c and adds its manifest, config and layers to
// blobs (path → content); it returns c's index entry.
func addImageBlobs(blobs map[string][]byte, c containerImage) (v1.Descriptor, error) {
	img, err := buildOCIImage(c)
	if err != nil {
		return v1.Descriptor{}, err
	}
	manifest, err := img.RawManifest()
	if err != nil {
		return v1.Descriptor{}, err
	}
	mdigest, err := img.Digest()
	if err != nil {
		return v1.Descriptor{}, err
	}
	config, err := img.RawConfigFile()
	if err != nil {
		return v1.Descriptor{}, err
	}
	cdigest, err := img.ConfigName()
	if err != nil {
		return v1.Descriptor{}, err
	}
	blobs[blobPath(mdigest)], blobs[blobPath(cdigest)] = manifest, config
	layers, err := img.Layers()
	if err != nil {
		return v1.Descriptor{}, err
	}
	for _, l := range layers {
		d, err := l.Digest()
		if err != nil {
			return v1.Descriptor{}, err
		}
		if _, ok := blobs[blobPath(d)]; ok {
			continue
		}
		rc, err := l.Compressed()
		if err != nil {
			return v1.Descriptor{}, err
		}
		data, err := io.ReadAll(rc)
		rc.Close()
		if err != nil {
			return v1.Descriptor{}, err
		}
		blobs[blobPath(d)] = data
	}
	tag := c.Ref[strings.LastIndex(c.Ref, ":")+1:]
	return v1.Descriptor{
		MediaType:   types.OCIManifestSchema1,
		Size:        int64(len(manifest)),
		Digest:      mdigest,
		Platform:    &v1.Platform{OS: "linux", Architecture: c.Arch},
		Annotations: map[string]string{annotationContainerdName: c.Ref, annotationOCIRefName: tag},
	}, nil
}

func blobPath(h v1.Hash) string { return path.Join("blobs", h.Algorithm, h.Hex) }

// buildOCIImage makes the image: its Layers, then Files as one more gzip
// layer, and an OCI config for linux/Arch with fixed timestamps.
func buildOCIImage(c containerImage) (v1.Image, error) {
	if !strings.Contains(c.Ref, ":") || c.Arch == "" || len(c.Entrypoint)+len(c.Cmd) == 0 {
		return nil, fmt.Errorf("container image %q: a tagged reference, an architecture and an entrypoint or command are required", c.Ref)
	}
	layers := slices.Clone(c.Layers)
	if len(c.Files) > 0 || len(layers) == 0 {
		var layerTar bytes.Buffer
		tw := tar.NewWriter(&layerTar)
		if err := writeTarFiles(tw, c.Files, 0o755); err != nil {
			return nil, err
		}
		if err := tw.Close(); err != nil {
			return nil, err
		}
		l, err := gzipLayer(layerTar.Bytes())
		if err != nil {
			return nil, err
		}
		layers = append(layers, l)
	}
	img := mutate.MediaType(empty.Image, types.OCIManifestSchema1)
	img = mutate.ConfigMediaType(img, types.OCIConfigJSON)
	for _, l := range layers {
		var err error
		img, err = mutate.Append(img, mutate.Addendum{
			Layer:     l,
			MediaType: types.OCILayer,
			History:   v1.History{Created: v1.Time{Time: ociEpoch}, CreatedBy: "plinth image builder", Comment: c.Ref},
		})
		if err != nil {
			return nil, err
		}
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
		Env:        c.Env,
		User:       c.User,
		WorkingDir: c.WorkingDir,
	}
	if cfg.Config.Env == nil {
		cfg.Config.Env = []string{"PATH=/"}
	}
	if cfg.Config.WorkingDir == "" {
		cfg.Config.WorkingDir = "/"
	}
	return mutate.ConfigFile(img, cfg)
}

// gzipLayer compresses a layer tar once (a layer's digest and content are
// then read from the same bytes, however often an archive asks).
func gzipLayer(tarData []byte) (v1.Layer, error) {
	var gz bytes.Buffer
	zw, err := gzip.NewWriterLevel(&gz, gzip.DefaultCompression)
	if err != nil {
		return nil, err
	}
	if _, err := zw.Write(tarData); err != nil {
		return nil, err
	}
	if err := zw.Close(); err != nil {
		return nil, err
	}
	return tarball.LayerFromOpener(func() (io.ReadCloser, error) {
		return io.NopCloser(bytes.NewReader(gz.Bytes())), nil
	}, tarball.WithMediaType(types.OCILayer))
}

// writeTarFiles writes regular files (sorted, owner 0:0, fixed time).
func writeTarFiles(tw *tar.Writer, files map[string][]byte, mode int64) error {
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
	return nil
}

// TestPodImage is the test workload's image (layout.TestImage) as the
// builder writes it into the system image, for a registry to serve it
// (the VM tests' pulls).
func TestPodImage(testpod []byte, arch string) (v1.Image, error) {
	return buildOCIImage(containerImage{Ref: layout.TestImage, Arch: arch, Entrypoint: []string{"/testpod"}, Cmd: []string{"serve"},
		Files: map[string][]byte{"testpod": testpod}})
}

// layerEntry is one entry of a layer made by newLayer: a regular file
// (Data), a symbolic link (Link) or a directory (Dir).
type layerEntry struct {
	Path string // relative: "bin/sh"
	// Mode is the permission bits, setuid included (0: 0755 for files
	// and directories).
	Mode int64
	Data []byte
	Link string
	Dir  bool
}

// newLayer makes a gzip layer of entries, sorted, each directory above
// an entry present (0755 unless an entry gives it), owner 0:0, fixed
// time: the same entries give the same layer.
func newLayer(entries []layerEntry) (v1.Layer, error) {
	byPath := map[string]layerEntry{}
	for _, e := range entries {
		p := path.Clean(e.Path)
		if p == "." || strings.HasPrefix(p, "/") || strings.HasPrefix(p, "../") {
			return nil, fmt.Errorf("layer entry %q: not a relative path inside the image", e.Path)
		}
		if _, dup := byPath[p]; dup {
			return nil, fmt.Errorf("layer entry %q given twice", p)
		}
		e.Path = p
		byPath[p] = e
		for d := path.Dir(p); d != "."; d = path.Dir(d) {
			if _, ok := byPath[d]; !ok {
				byPath[d] = layerEntry{Path: d, Dir: true}
			}
		}
	}
	paths := make([]string, 0, len(byPath))
	for p := range byPath {
		paths = append(paths, p)
	}
	sort.Strings(paths)
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	for _, p := range paths {
		e := byPath[p]
		mode := e.Mode
		if mode == 0 {
			mode = 0o755
		}
		h := &tar.Header{Name: p, Mode: mode, ModTime: ociEpoch, Format: tar.FormatPAX}
		switch {
		case e.Dir:
			h.Typeflag, h.Name = tar.TypeDir, p+"/"
		case e.Link != "":
			h.Typeflag, h.Linkname, h.Mode = tar.TypeSymlink, e.Link, 0o777
		default:
			h.Typeflag, h.Size = tar.TypeReg, int64(len(e.Data))
		}
		if err := tw.WriteHeader(h); err != nil {
			return nil, err
		}
		if h.Typeflag == tar.TypeReg {
			if _, err := tw.Write(e.Data); err != nil {
				return nil, err
			}
		}
	}
	if err := tw.Close(); err != nil {
		return nil, err
	}
	return gzipLayer(buf.Bytes())
}
