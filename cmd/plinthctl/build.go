package main

import (
	"context"
	"fmt"
	"io"

	"plinth.dev/plinth/board"
	"plinth.dev/plinth/image"
)

func init() {
	register("build", "build a node image (kernel, initramfs with system image, manifest)", func() verb { return new(buildCmd) })
}

// buildCmd is `plinthctl build`: the image builder (package image) for
// one board.
type buildCmd struct {
	board         string
	kernelPackage string
	cache         string
	init          string
	bin           string
	out           string
	version       string
}

func (c *buildCmd) run(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs := newFlagSet("build", stderr)
	fs.StringVar(&c.board, "board", board.Default, "board to build for")
	fs.StringVar(&c.kernelPackage, "kernel-package", "", "path of the board's Debian kernel package (default: fetched into -cache)")
	fs.StringVar(&c.cache, "cache", "out/cache", "directory for downloaded kernel packages")
	fs.StringVar(&c.init, "init", "", "static /init binary (make builds out/bin/init)")
	fs.StringVar(&c.bin, "bin", "", "directory with kube, containerd, containerd-shim-runc-v2, runc, cni/{host-local,loopback,ptp} and testpod (make builds them in out/bin)")
	fs.StringVar(&c.out, "out", "out/image/"+board.Default, "output directory")
	fs.StringVar(&c.version, "version", "dev", "version recorded in the image")
	fs.Parse(args)
	b, err := board.Get(c.board)
	if err != nil {
		return err
	}
	if c.init == "" {
		return fmt.Errorf("-init is required (make builds out/bin/init)")
	}
	if c.bin == "" {
		return fmt.Errorf("-bin is required: the directory of the Kubernetes binaries and testpod (make builds them in out/bin)")
	}
	if c.kernelPackage == "" {
		if c.kernelPackage, err = image.FetchKernelPackage(ctx, b.KernelPackage, c.cache, stdout); err != nil {
			return err
		}
	}
	m, err := image.Build(ctx, image.Config{Board: b, KernelPackage: c.kernelPackage, Init: c.init, Binaries: image.BinariesIn(c.bin), OutDir: c.out, Version: c.version, Progress: stdout})
	if err != nil {
		return err
	}
	fmt.Fprintf(stdout, "image for %s in %s\n  kernel %s\n  verity root hash %s\n", m.Board, c.out, m.KernelVersion, m.Verity.RootHash)
	for _, name := range []string{image.KernelFile, image.InitramfsFile, image.SystemFile} {
		a := m.Artefacts[name]
		fmt.Fprintf(stdout, "  %-14s %8.1f MiB  sha256 %s\n", name, float64(a.Size)/(1<<20), a.SHA256[:16])
	}
	return nil
}
