// Package ociarchive reads what an OCI image archive (a tar of an OCI
// image layout: oci-layout, index.json, blobs/) says it holds, without
// reading its blobs: the Kubernetes worker's image import asks it whether
// the store already has an archive's images, so that the archives of the
// system image are read once per image version, not at every boot.
//
//	archive.tar
//	  oci-layout
//	  index.json   manifests[]: digest, annotations io.containerd.image.name
//	  blobs/sha256/…
package ociarchive

import (
	"archive/tar"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
)

// NameAnnotation is the index annotation naming an image by its full
// reference (the builder writes it, containerd's import reads it).
const NameAnnotation = "io.containerd.image.name"

// Ref is one image of an archive.
type Ref struct {
	Name   string // full reference, e.g. plinth.dev/pause:v1
	Digest string // of its manifest, e.g. sha256:…
}

// ErrNoIndex: the file is not an OCI image archive.
var ErrNoIndex = errors.New("ociarchive: no index.json")

// Refs returns the named images of the archive at path, in index order.
func Refs(path string) ([]Ref, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	refs, err := Read(f)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	return refs, nil
}

// Read returns the named images of the archive r reads, in index order.
func Read(r io.Reader) ([]Ref, error) {
	tr := tar.NewReader(r)
	for {
		h, err := tr.Next()
		if err == io.EOF {
			return nil, ErrNoIndex
		}
		if err != nil {
			return nil, err
		}
		if h.Name != "index.json" {
			continue
		}
		var index struct {
			Manifests []struct {
				Digest      string            `json:"digest"`
				Annotations map[string]string `json:"annotations"`
			} `json:"manifests"`
		}
		if err := json.NewDecoder(io.LimitReader(tr, 1<<20)).Decode(&index); err != nil {
			return nil, fmt.Errorf("index.json: %w", err)
		}
		var out []Ref
		for _, m := range index.Manifests {
			if n := m.Annotations[NameAnnotation]; n != "" {
				out = append(out, Ref{Name: n, Digest: m.Digest})
			}
		}
		return out, nil
	}
}
