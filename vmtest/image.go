package vmtest

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
func LoadImage(dir string) (*Image, error) {
	m, err := image.ReadManifest(dir)
	if err != nil {
		return nil, fmt.Errorf("no image in %s (run `make image`): %w", dir, err)
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

// DefaultImageDir is where `make image` puts the default board's image,
// unless PLINTH_IMAGE says otherwise.
func DefaultImageDir() (string, error) {
	if d := os.Getenv("PLINTH_IMAGE"); d != "" {
		return d, nil
	}
	root, err := repoRoot()
	if err != nil {
		return "", err
	}
	return filepath.Join(root, "out", "image", board.Default), nil
}

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
