package main

import (
	"context"
	"flag"
	"fmt"
	"os"

	"plinth.dev/plinth/board"
	"plinth.dev/plinth/image"
)

func init() {
	commands["build"] = command{"build a node image (kernel, initramfs with system image, manifest)", runBuild}
}

func runBuild(ctx context.Context, args []string) error {
	fs := flag.NewFlagSet("build", flag.ExitOnError)
	boardName := fs.String("board", board.Default, "board to build for")
	kernelPkg := fs.String("kernel-package", "", "path of the board's Debian kernel package (default: fetched into -cache)")
	cache := fs.String("cache", "out/cache", "directory for downloaded kernel packages")
	initBin := fs.String("init", "", "static /init binary (make builds out/init)")
	out := fs.String("out", "out/image/"+board.Default, "output directory")
	version := fs.String("version", "dev", "version recorded in the image")
	fs.Parse(args)
	b, err := board.Get(*boardName)
	if err != nil {
		return err
	}
	if *initBin == "" {
		return fmt.Errorf("-init is required (make builds out/bin/init)")
	}
	if *kernelPkg == "" {
		if *kernelPkg, err = image.FetchKernelPackage(ctx, b.KernelPackage, *cache, os.Stdout); err != nil {
			return err
		}
	}
	m, err := image.Build(ctx, image.Config{Board: b, KernelPackage: *kernelPkg, Init: *initBin, OutDir: *out, Version: *version, Progress: os.Stdout})
	if err != nil {
		return err
	}
	fmt.Printf("image for %s in %s\n  kernel %s\n  verity root hash %s\n", m.Board, *out, m.KernelVersion, m.Verity.RootHash)
	for _, name := range []string{image.KernelFile, image.InitramfsFile, image.SystemFile} {
		a := m.Artefacts[name]
		fmt.Printf("  %-14s %8.1f MiB  sha256 %s\n", name, float64(a.Size)/(1<<20), a.SHA256[:16])
	}
	return nil
}

func init() {
	commands["fetch-kernel"] = command{"download the board's Debian kernel package into the cache", func(ctx context.Context, args []string) error {
		fs := flag.NewFlagSet("fetch-kernel", flag.ExitOnError)
		boardName := fs.String("board", board.Default, "board")
		cache := fs.String("cache", "out/cache", "cache directory")
		fs.Parse(args)
		b, err := board.Get(*boardName)
		if err != nil {
			return err
		}
		p, err := image.FetchKernelPackage(ctx, b.KernelPackage, *cache, os.Stderr)
		if err == nil {
			fmt.Println(p)
		}
		return err
	}}
}
