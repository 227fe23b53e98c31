package launch

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"

	"plinth.dev/plinth/board"
	"plinth.dev/plinth/image"
)

// Image is a built node image (the output directory of `plinthctl build`).
type Image struct {
	Dir      string
	Manifest *image.Manifest
	Board    *board.Board
}

// LoadImage reads the manifest in dir and checks the artefacts are there.
func LoadImage(dir string) (*Image, error) { return loadImage(dir, DefaultImage.Target) }

// loadImage is LoadImage of an image `make target` builds.
func loadImage(dir, target string) (*Image, error) {
	m, err := image.ReadManifest(dir)
	if err != nil {
		return nil, fmt.Errorf("no image in %s (run `make %s`): %w", dir, target, err)
	}
	b, err := board.Get(m.Board)
	if err != nil {
		return nil, err
	}
	for _, f := range []string{image.KernelFile, image.InitramfsFile} {
		if _, err := os.Stat(filepath.Join(dir, f)); err != nil {
			return nil, err
		}
	}
	return &Image{Dir: dir, Manifest: m, Board: b}, nil
}

// The images the tests boot, as make builds and exports them: the
// environment variable make sets, the directory under out/ of the
// repository it builds the image in, and its target.
var (
	// DefaultImage is the default board's image (`make image`).
	DefaultImage = ImageRef{Env: "PLINTH_IMAGE", Dir: filepath.Join("image", board.Default), Target: "image"}
	// NextImage is the default board's image again with another version,
	// so another system image: what a test updates to (`make image-next`).
	NextImage = ImageRef{Env: "PLINTH_NEXT_IMAGE", Dir: filepath.Join("image-next", board.Default), Target: "image-next"}
	// GenericImage is the generic-x86_64 board's image (`make
	// image-generic`).
	GenericImage = ImageRef{Env: "PLINTH_GENERIC_IMAGE", Dir: filepath.Join("image", "generic-x86_64"), Target: "image-generic"}
)

// ImageRef names a built image: the directory environment variable Env
// names or, if Env is unset, out/Dir of the repository, where `make
// Target` puts it: one rule for every image the tests boot, the one
// make follows when it exports them.
type ImageRef struct{ Env, Dir, Target string }

// Path is the image directory r names.
func (r ImageRef) Path() (string, error) { return FromEnv(r.Env, r.Dir) }

// FromEnv is the path environment variable env names or, if env is
// unset, out/rel of the repository: where make puts what it builds (and
// exports the path of, so that a test run by make uses what make built).
func FromEnv(env, rel string) (string, error) {
	if p := os.Getenv(env); p != "" {
		return p, nil
	}
	root, err := RepoRoot()
	if err != nil {
		return "", fmt.Errorf("launch: %w (set %s)", err, env)
	}
	return filepath.Join(root, "out", rel), nil
}

// Load loads the image r names; a missing one's error names the make
// target that builds it.
func (r ImageRef) Load() (*Image, error) {
	dir, err := r.Path()
	if err != nil {
		return nil, err
	}
	return loadImage(dir, r.Target)
}

// DefaultImageDir is where `make image` puts the default board's image,
// unless PLINTH_IMAGE says otherwise.
func DefaultImageDir() (string, error) { return DefaultImage.Path() }

// NodeOptions returns options booting this image the way its board says;
// the caller adds WorkDir, disk, TPM state and so on.
func (i *Image) NodeOptions(name string) NodeOptions {
	return NodeOptions{
		Name:      name,
		Kernel:    filepath.Join(i.Dir, image.KernelFile),
		Initramfs: filepath.Join(i.Dir, image.InitramfsFile),
		Cmdline:   strings.TrimSpace(i.Manifest.Cmdline),
		MemoryMiB: i.Board.QEMU.MemoryMiB,
		CPUs:      i.Board.QEMU.CPUs,
	}
}

// DiskBootOptions returns options booting this image's disk.img through
// UEFI: disk, a copy of disk.img grown to size bytes (made on the first
// call, kept after), with the parameters file params on its ESP. The
// caller adds WorkDir, UEFI, TPM state and so on.
func (i *Image) DiskBootOptions(name, disk string, size int64, params string) (NodeOptions, error) {
	if _, err := os.Stat(disk); errors.Is(err, os.ErrNotExist) {
		if err := i.FlashDisk(disk, size, params); err != nil {
			return NodeOptions{}, err
		}
	}
	return NodeOptions{Name: name, DiskPath: disk, MemoryMiB: i.Board.QEMU.MemoryMiB, CPUs: i.Board.QEMU.CPUs}, nil
}

// FlashDisk writes disk.img with the parameters file params to the file
// disk, size bytes, as `plinthctl write-disk` does (image.WriteDisk).
func (i *Image) FlashDisk(disk string, size int64, params string) error {
	raw, err := os.ReadFile(params)
	if err != nil {
		return err
	}
	return image.WriteDisk(context.Background(), image.WriteDiskConfig{ImageDir: i.Dir, Parameters: raw, Target: disk, Size: size})
}

// RepoRoot walks up from the working directory to the directory holding
// go.mod; `go test` runs in the package directory, so this finds the
// checkout the test belongs to.
func RepoRoot() (string, error) {
	dir, err := os.Getwd()
	if err != nil {
		return "", err
	}
	for {
		if _, err := os.Stat(filepath.Join(dir, "go.mod")); err == nil {
			return dir, nil
		}
		parent := filepath.Dir(dir)
		if parent == dir {
			return "", errors.New("no go.mod above the working directory")
		}
		dir = parent
	}
}
