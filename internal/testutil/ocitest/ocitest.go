// Package ocitest writes OCI image archives as tools outside Plinth do:
// go-containerregistry's image layout writer (the library under crane),
// its directory then put into a tar, like `skopeo copy oci-archive:`
// output. The builder's --oci-archive tests and the VM tests' user image
// take their archives from here, so the builder is checked against
// another writer than its own (image/oci.go).
//
//	WriteArchive(path, entries)
//	  layout.Write(dir) ─ AppendImage / AppendIndex, annotated
//	  tar(dir)          ─ sorted, fixed times: the same input, the same bytes
package ocitest

import (
	"archive/tar"
	"errors"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"sort"
	"time"

	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/layout"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
)

// RefNameAnnotation is the OCI image layout's name of an index entry:
// a tag ("v1") or a full reference, as the writer chose.
const RefNameAnnotation = "org.opencontainers.image.ref.name"

// Entry is one entry of the archive's index.json: an image or a
// multi-platform index, with its annotations.
type Entry struct {
	Image       v1.Image
	Index       v1.ImageIndex
	Annotations map[string]string
}

// WriteArchive writes the entries as an OCI image archive at path.
func WriteArchive(path string, entries ...Entry) error {
	dir, err := os.MkdirTemp("", "ocitest-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(dir)
	p, err := layout.Write(dir, empty.Index)
	if err != nil {
		return err
	}
	for _, e := range entries {
		opts := []layout.Option{layout.WithAnnotations(e.Annotations)}
		switch {
		case e.Image != nil:
			err = p.AppendImage(e.Image, opts...)
		case e.Index != nil:
			err = p.AppendIndex(e.Index, opts...)
		default:
			err = errors.New("ocitest: an entry needs an image or an index")
		}
		if err != nil {
			return err
		}
	}
	return tarDir(dir, path)
}

// tarDir writes the files under dir, sorted, with fixed times and owner,
// as a tar at path.
func tarDir(dir, path string) error {
	var names []string
	err := filepath.WalkDir(dir, func(p string, d fs.DirEntry, err error) error {
		if err != nil || p == dir {
			return err
		}
		rel, err := filepath.Rel(dir, p)
		names = append(names, filepath.ToSlash(rel))
		return err
	})
	if err != nil {
		return err
	}
	sort.Strings(names)
	out, err := os.Create(path)
	if err != nil {
		return err
	}
	tw := tar.NewWriter(out)
	for _, n := range names {
		fi, err := os.Stat(filepath.Join(dir, n))
		if err != nil {
			break
		}
		h := &tar.Header{Name: n, Mode: 0o644, ModTime: time.Unix(0, 0), Typeflag: tar.TypeReg, Size: fi.Size()}
		if fi.IsDir() {
			h.Name, h.Mode, h.Typeflag, h.Size = n+"/", 0o755, tar.TypeDir, 0
		}
		if err = tw.WriteHeader(h); err != nil {
			break
		}
		if !fi.IsDir() {
			if err = copyInto(tw, filepath.Join(dir, n)); err != nil {
				break
			}
		}
	}
	return errors.Join(err, tw.Close(), out.Close())
}

func copyInto(w io.Writer, p string) error {
	f, err := os.Open(p)
	if err != nil {
		return err
	}
	defer f.Close()
	_, err = io.Copy(w, f)
	return err
}

// Labelled is img with a config label more: another config, so another
// image ID, the same layers.
func Labelled(img v1.Image, key, value string) (v1.Image, error) {
	cfg, err := img.ConfigFile()
	if err != nil {
		return nil, err
	}
	c := cfg.Config.DeepCopy()
	if c.Labels == nil {
		c.Labels = map[string]string{}
	}
	c.Labels[key] = value
	return mutate.Config(img, *c)
}
