package image

import (
	"archive/tar"
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"path"
	"path/filepath"
	"sort"
	"strings"

	"github.com/distribution/reference"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/types"

	"plinth.dev/plinth/platform/layout"
	"plinth.dev/plinth/platform/ociarchive"
)

// The user's own container images in the system image (plinthctl build
// --oci-archive), for sites without a registry: each OCI image archive
// (an OCI image layout as a tar, as `docker save`, `skopeo copy
// oci-archive:`, crane or ggcr's layout write it) is checked whole at
// build time and carried next to the pause and test images, which the
// node imports at boot and pins (cmd/kube import-images), so pods of
// those references start without touching a network.
//
//	user archive ── check: oci-layout, every blob's sha256 and size,
//	   │            the board's linux/ARCH manifest, its config, its layers
//	   │            name: io.containerd.image.name, or a full
//	   │            org.opencontainers.image.ref.name, or FILE=REF
//	   ▼
//	/usr/share/plinth/images/user-NAME.tar   the same entries, index.json
//	                                         naming each image by its
//	                                         normalized reference
//
// Why checked here: an archive the node could not import (a missing
// blob, another architecture, no name) would otherwise fail only on the
// node, at boot, with the image already released.

// OCIArchive is one user OCI image archive for the system image.
type OCIArchive struct {
	Path string
	// Ref names the archive's one image when its index does not (an
	// index that carries only a tag); "" takes the names of the index.
	Ref string
}

// ParseOCIArchive reads plinthctl build's --oci-archive value: FILE or
// FILE=REF.
func ParseOCIArchive(s string) (OCIArchive, error) {
	p, ref, _ := strings.Cut(s, "=")
	if p == "" {
		return OCIArchive{}, fmt.Errorf("--oci-archive %q: want FILE or FILE=REFERENCE", s)
	}
	if ref != "" {
		if _, err := normalizedRef(ref); err != nil {
			return OCIArchive{}, fmt.Errorf("--oci-archive %q: %w", s, err)
		}
	}
	return OCIArchive{Path: p, Ref: ref}, nil
}

// ContainerImage is one image the system image carries, in the manifest.
type ContainerImage struct {
	Ref string `json:"ref"` // normalized, e.g. docker.io/library/nginx:1.27
	// Digest is the index entry's: a manifest or a multi-platform index.
	Digest string `json:"digest"`
	// Archive is the archive's path on the node.
	Archive string `json:"archive"`
}

// maxMetadataBlob bounds what the check holds in memory: indexes,
// manifests and configs are a few KiB.
const maxMetadataBlob = 4 << 20

// archiveContents is what one pass over an archive found.
type archiveContents struct {
	index []byte
	blobs map[string]int64  // digest → size, each checked
	small map[string][]byte // digest → content, for blobs up to maxMetadataBlob
}

// readArchive reads every entry of the archive at p once, checking each
// blob's sha256 against its name.
func readArchive(p string) (*archiveContents, error) {
	f, err := os.Open(p)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	c := &archiveContents{blobs: map[string]int64{}, small: map[string][]byte{}}
	layoutSeen := false
	tr := tar.NewReader(f)
	for {
		h, err := tr.Next()
		if err == io.EOF {
			break
		}
		if err != nil {
			return nil, fmt.Errorf("not a tar archive: %w", err)
		}
		name := strings.TrimPrefix(path.Clean("/"+h.Name), "/")
		if h.Typeflag == tar.TypeDir {
			continue
		}
		switch {
		case name == "oci-layout":
			var l struct {
				Version string `json:"imageLayoutVersion"`
			}
			if err := json.NewDecoder(io.LimitReader(tr, 4096)).Decode(&l); err != nil || l.Version == "" {
				return nil, fmt.Errorf("oci-layout: not an OCI image layout file")
			}
			layoutSeen = true
		case name == "index.json":
			if c.index, err = io.ReadAll(io.LimitReader(tr, maxMetadataBlob)); err != nil {
				return nil, err
			}
		case strings.HasPrefix(name, "blobs/"):
			alg, hexd, ok := strings.Cut(strings.TrimPrefix(name, "blobs/"), "/")
			if alg != "sha256" || !ok || len(hexd) != 64 {
				return nil, fmt.Errorf("%s: only sha256 blobs are supported", name)
			}
			if h.Typeflag != tar.TypeReg {
				return nil, fmt.Errorf("%s: not a regular file", name)
			}
			d := alg + ":" + hexd
			if _, dup := c.blobs[d]; dup {
				return nil, fmt.Errorf("%s: twice in the archive", name)
			}
			sum := sha256.New()
			var small bytes.Buffer
			w := io.Writer(sum)
			if h.Size <= maxMetadataBlob {
				w = io.MultiWriter(sum, &small)
			}
			n, err := io.Copy(w, tr)
			if err != nil {
				return nil, fmt.Errorf("%s: %w", name, err)
			}
			if got := hex.EncodeToString(sum.Sum(nil)); got != hexd {
				return nil, fmt.Errorf("%s: its content's sha256 is %s: the archive is corrupt", name, got)
			}
			c.blobs[d] = n
			if h.Size <= maxMetadataBlob {
				c.small[d] = small.Bytes()
			}
		}
	}
	switch {
	case !layoutSeen:
		return nil, fmt.Errorf("no oci-layout file: not an OCI image archive (docker save, skopeo copy oci-archive:, crane and ggcr write them)")
	case c.index == nil:
		return nil, fmt.Errorf("no index.json: not an OCI image archive")
	}
	return c, nil
}

// blob returns a metadata blob the descriptor d names, checking its size.
func (c *archiveContents) blob(d v1.Descriptor) ([]byte, error) {
	b, ok := c.small[d.Digest.String()]
	if !ok {
		if _, big := c.blobs[d.Digest.String()]; big {
			return nil, fmt.Errorf("%s (%s) is over %d bytes", d.Digest, d.MediaType, maxMetadataBlob)
		}
		return nil, fmt.Errorf("blob %s (%s) is not in the archive", d.Digest, d.MediaType)
	}
	if int64(len(b)) != d.Size {
		return nil, fmt.Errorf("blob %s is %d bytes, its descriptor says %d", d.Digest, len(b), d.Size)
	}
	return b, nil
}

// checkImage checks that descriptor d (from index.json) gives an image
// for linux/arch with every blob present.
func (c *archiveContents) checkImage(d v1.Descriptor, arch string) error {
	if d.MediaType == types.OCIImageIndex || d.MediaType == types.DockerManifestList {
		raw, err := c.blob(d)
		if err != nil {
			return err
		}
		idx, err := v1.ParseIndexManifest(bytes.NewReader(raw))
		if err != nil {
			return fmt.Errorf("index %s: %w", d.Digest, err)
		}
		var have []string
		for _, m := range idx.Manifests {
			if m.Platform != nil && m.Platform.OS == "linux" && m.Platform.Architecture == arch {
				return c.checkImage(m, arch)
			}
			if m.Platform != nil {
				have = append(have, m.Platform.OS+"/"+m.Platform.Architecture)
			}
		}
		return fmt.Errorf("index %s has no linux/%s image (it has %s)", d.Digest, arch, strings.Join(have, ", "))
	}
	if d.MediaType != types.OCIManifestSchema1 && d.MediaType != types.DockerManifestSchema2 {
		return fmt.Errorf("%s: media type %q is not an image manifest or index", d.Digest, d.MediaType)
	}
	raw, err := c.blob(d)
	if err != nil {
		return err
	}
	m, err := v1.ParseManifest(bytes.NewReader(raw))
	if err != nil {
		return fmt.Errorf("manifest %s: %w", d.Digest, err)
	}
	rawConfig, err := c.blob(m.Config)
	if err != nil {
		return fmt.Errorf("manifest %s: config: %w", d.Digest, err)
	}
	cfg, err := v1.ParseConfigFile(bytes.NewReader(rawConfig))
	if err != nil {
		return fmt.Errorf("manifest %s: config: %w", d.Digest, err)
	}
	if cfg.OS != "linux" || cfg.Architecture != arch {
		return fmt.Errorf("manifest %s is an image for %s/%s, the board runs linux/%s", d.Digest, cfg.OS, cfg.Architecture, arch)
	}
	for _, l := range m.Layers {
		size, ok := c.blobs[l.Digest.String()]
		switch {
		case !ok:
			return fmt.Errorf("manifest %s: layer %s is not in the archive", d.Digest, l.Digest)
		case size != l.Size:
			return fmt.Errorf("manifest %s: layer %s is %d bytes, the manifest says %d", d.Digest, l.Digest, size, l.Size)
		}
	}
	return nil
}

// normalizedRef is ref as the CRI names images: docker.io/library/nginx:1.27
// for nginx:1.27. A reference must be a name with a tag or a digest.
func normalizedRef(ref string) (string, error) {
	named, err := reference.ParseDockerRef(ref)
	if err != nil {
		return "", fmt.Errorf("image reference %q: %w", ref, err)
	}
	return named.String(), nil
}

// imageName is the name the index gives descriptor d: containerd's
// annotation, or the OCI one when it is a reference rather than a bare
// tag ("1.27").
func imageName(d v1.Descriptor) string {
	if n := d.Annotations[ociarchive.NameAnnotation]; n != "" {
		return n
	}
	if n := d.Annotations[annotationOCIRefName]; strings.ContainsAny(n, ":/@") {
		return n
	}
	return ""
}

// checkOCIArchive checks the archive a for the board's architecture and
// returns its index with each image named by its normalized reference in
// containerd's annotation, and the images.
func checkOCIArchive(a OCIArchive, arch string) ([]byte, []ContainerImage, error) {
	c, err := readArchive(a.Path)
	if err != nil {
		return nil, nil, err
	}
	// Decoded as a map as well, so that the rewritten index keeps every
	// field the builder does not know of.
	var index map[string]json.RawMessage
	var parsed v1.IndexManifest
	if err := json.Unmarshal(c.index, &index); err != nil {
		return nil, nil, fmt.Errorf("index.json: %w", err)
	}
	if err := json.Unmarshal(c.index, &parsed); err != nil {
		return nil, nil, fmt.Errorf("index.json: %w", err)
	}
	if len(parsed.Manifests) == 0 {
		return nil, nil, errors.New("index.json lists no image")
	}
	if a.Ref != "" && len(parsed.Manifests) != 1 {
		return nil, nil, fmt.Errorf("=%s names one image, the archive has %d: name them in the archive (io.containerd.image.name)", a.Ref, len(parsed.Manifests))
	}
	var images []ContainerImage
	for i, d := range parsed.Manifests {
		name := imageName(d)
		if a.Ref != "" {
			name = a.Ref
		}
		if name == "" {
			return nil, nil, fmt.Errorf("image %s has no full reference (neither io.containerd.image.name nor a reference in org.opencontainers.image.ref.name): name it with --oci-archive %s=REFERENCE", d.Digest, a.Path)
		}
		ref, err := normalizedRef(name)
		if err != nil {
			return nil, nil, err
		}
		if err := c.checkImage(d, arch); err != nil {
			return nil, nil, fmt.Errorf("%s: %w", ref, err)
		}
		if parsed.Manifests[i].Annotations == nil {
			parsed.Manifests[i].Annotations = map[string]string{}
		}
		parsed.Manifests[i].Annotations[ociarchive.NameAnnotation] = ref
		images = append(images, ContainerImage{Ref: ref, Digest: d.Digest.String()})
	}
	// Only the manifests' annotations change.
	var manifests []map[string]json.RawMessage
	if err := json.Unmarshal(index["manifests"], &manifests); err != nil {
		return nil, nil, fmt.Errorf("index.json: %w", err)
	}
	for i := range manifests {
		ann, err := json.Marshal(parsed.Manifests[i].Annotations)
		if err != nil {
			return nil, nil, err
		}
		manifests[i]["annotations"] = ann
	}
	if index["manifests"], err = json.Marshal(manifests); err != nil {
		return nil, nil, err
	}
	out, err := json.Marshal(index)
	return out, images, err
}

// rewriteArchive copies the archive at src to dst with index.json
// replaced by index: every other entry as it was, in its order.
func rewriteArchive(src, dst string, index []byte) error {
	in, err := os.Open(src)
	if err != nil {
		return err
	}
	defer in.Close()
	out, err := os.Create(dst)
	if err != nil {
		return err
	}
	tr, tw := tar.NewReader(in), tar.NewWriter(out)
	err = func() error {
		for {
			h, err := tr.Next()
			if err == io.EOF {
				return tw.Close()
			}
			if err != nil {
				return err
			}
			body := io.Reader(tr)
			if strings.TrimPrefix(path.Clean("/"+h.Name), "/") == "index.json" {
				h.Size, body = int64(len(index)), bytes.NewReader(index)
			}
			if err := tw.WriteHeader(h); err != nil {
				return err
			}
			if _, err := io.Copy(tw, body); err != nil {
				return err
			}
		}
	}()
	return errors.Join(err, out.Close())
}

// userArchiveName is the file name of archive p in layout.ImagesDir:
// "user-" keeps it apart from the builder's own.
func userArchiveName(p string) string {
	base := strings.TrimSuffix(filepath.Base(p), filepath.Ext(p))
	clean := strings.Map(func(r rune) rune {
		if r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z' || r >= '0' && r <= '9' || r == '-' || r == '_' || r == '.' {
			return r
		}
		return '_'
	}, base)
	return "user-" + clean + ".tar"
}

// userImageFiles checks every archive and writes its rewritten copy into
// dir: the system image files and the images they carry. taken are the
// builder's own references, which no user image may reuse.
func userImageFiles(archives []OCIArchive, arch, dir string, taken map[string]bool) ([]sysFile, []ContainerImage, error) {
	var files []sysFile
	var all []ContainerImage
	names := map[string]string{}
	for _, a := range archives {
		name := userArchiveName(a.Path)
		if other, dup := names[name]; dup {
			return nil, nil, fmt.Errorf("OCI archives %s and %s would both be %s on the node: rename one", other, a.Path, name)
		}
		names[name] = a.Path
		index, images, err := checkOCIArchive(a, arch)
		if err != nil {
			return nil, nil, fmt.Errorf("OCI archive %s: %w", a.Path, err)
		}
		for i, img := range images {
			if taken[img.Ref] {
				return nil, nil, fmt.Errorf("OCI archive %s: %s is already in the image (the node's own, or another archive's)", a.Path, img.Ref)
			}
			taken[img.Ref] = true
			images[i].Archive = filepath.Join(layout.ImagesDir, name)
		}
		dst := filepath.Join(dir, name)
		if err := rewriteArchive(a.Path, dst, index); err != nil {
			return nil, nil, fmt.Errorf("OCI archive %s: %w", a.Path, err)
		}
		files = append(files, sysFile{Path: strings.TrimPrefix(filepath.Join(layout.ImagesDir, name), "/"), Source: dst, Mode: 0o644})
		all = append(all, images...)
	}
	sort.Slice(all, func(i, j int) bool { return all[i].Ref < all[j].Ref })
	return files, all, nil
}
