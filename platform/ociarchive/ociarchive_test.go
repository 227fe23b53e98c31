package ociarchive

import (
	"archive/tar"
	"errors"
	"os"
	"path/filepath"
	"slices"
	"testing"
)

func writeTar(t *testing.T, files map[string]string, order ...string) string {
	t.Helper()
	p := filepath.Join(t.TempDir(), "a.tar")
	f, err := os.Create(p)
	if err != nil {
		t.Fatal(err)
	}
	tw := tar.NewWriter(f)
	for _, name := range order {
		tw.WriteHeader(&tar.Header{Name: name, Mode: 0o644, Size: int64(len(files[name]))})
		tw.Write([]byte(files[name]))
	}
	tw.Close()
	f.Close()
	return p
}

func TestRefs(t *testing.T) {
	p := writeTar(t, map[string]string{
		"oci-layout":      `{"imageLayoutVersion":"1.0.0"}`,
		"blobs/sha256/aa": "blob",
		"index.json":      `{"schemaVersion":2,"manifests":[{"digest":"sha256:aa","annotations":{"io.containerd.image.name":"plinth.dev/pause:v1","org.opencontainers.image.ref.name":"v1"}},{"digest":"sha256:bb"}]}`,
	}, "oci-layout", "blobs/sha256/aa", "index.json")
	refs, err := Refs(p)
	if err != nil || !slices.Equal(refs, []Ref{{"plinth.dev/pause:v1", "sha256:aa"}}) {
		t.Errorf("Refs = %v, %v", refs, err)
	}
	if _, err := Refs(writeTar(t, map[string]string{"x": "y"}, "x")); !errors.Is(err, ErrNoIndex) {
		t.Errorf("an archive without index.json: %v", err)
	}
	if _, err := Refs(writeTar(t, map[string]string{"index.json": "{"}, "index.json")); err == nil {
		t.Error("a broken index.json was read")
	}
}
