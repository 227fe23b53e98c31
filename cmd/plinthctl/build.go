package main

import (
	"context"
	"crypto/ed25519"
	"fmt"
	"io"
	"os"

	"plinth.dev/plinth/board"
	"plinth.dev/plinth/image"
	"plinth.dev/plinth/roleserver/parameters"
)

func init() {
	register("build", "build a node image (kernel, initramfs with system image, manifest)", func() verb { return new(buildCmd) })
}

// buildCmd is `plinthctl build`: the image builder (package image) for
// one board. With -sign-key and -release it signs the image as release N
// (manifest.sig; the system image carries the key and the number):
// nodes install only images one of their cluster's release keys signed,
// and none older than what they run.
type buildCmd struct {
	board         string
	kernelPackage string
	cache         string
	init          string
	bin           string
	out           string
	version       string
	params        string
	signKey       string
	release       uint64
	ociArchives   listFlag
	conformance   string
}

func (c *buildCmd) run(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs := newFlagSet("build", stderr)
	fs.StringVar(&c.board, "board", board.Default, "board to build for")
	fs.StringVar(&c.kernelPackage, "kernel-package", "", "path of the board's Debian kernel package (default: fetched into -cache)")
	fs.StringVar(&c.cache, "cache", "out/cache", "directory for downloaded kernel packages")
	fs.StringVar(&c.init, "init", "", "static /init binary (make builds out/bin/init)")
	fs.StringVar(&c.bin, "bin", "", "directory with kube, containerd, containerd-shim-runc-v2, crun, cni/{host-local,loopback,portmap,ptp} and testpod (make builds them in out/bin)")
	fs.StringVar(&c.out, "out", "out/image/"+board.Default, "output directory")
	fs.StringVar(&c.version, "version", "dev", "version recorded in the image")
	fs.StringVar(&c.params, "params", "", "a cluster's register parameters (plinthctl params -register), put into the network-boot UKI's measured command line: one plinth.efi for every node that boots it")
	fs.StringVar(&c.signKey, "sign-key", "", "release key `file` (plinthctl release-key -o FILE) that signs the image: nodes install only images their cluster's release keys signed")
	fs.Uint64Var(&c.release, "release", 0, "release `number` of the image, required with -sign-key: nodes refuse an update to an older release (0: unreleased)")
	fs.Var(&c.ociArchives, "oci-archive", "OCI image archive `FILE[=REF]` (docker save, skopeo copy oci-archive:, crane) carried in the system image, imported and pinned at boot: pods of its images start without a registry (repeat). REF names the archive's one image when its index gives only a tag")
	fs.StringVar(&c.conformance, "conformance-images", "", "add the upstream Kubernetes conformance tests' images, made from the programs in `DIR` (make e2e builds out/bin/conformance: agnhost, e2etools, nnp, busybox)")
	fs.Parse(args)
	var archives []image.OCIArchive
	for _, a := range c.ociArchives {
		arch, err := image.ParseOCIArchive(a)
		if err != nil {
			return err
		}
		archives = append(archives, arch)
	}
	var key ed25519.PrivateKey
	if c.signKey != "" {
		if !flagSet(fs, "release") {
			return fmt.Errorf("-sign-key needs -release N: the number that orders this image among the signed ones (nodes refuse older ones)")
		}
		var err error
		if key, err = readReleaseKey(c.signKey); err != nil {
			return fmt.Errorf("-sign-key: %w", err)
		}
	}
	var netboot []string
	if c.params != "" {
		arg, err := netbootParameters(c.params)
		if err != nil {
			return err
		}
		netboot = append(netboot, arg)
	}
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
	var conformance *image.ConformanceInputs
	if c.conformance != "" {
		conformance = &image.ConformanceInputs{Dir: c.conformance}
	}
	m, err := image.Build(ctx, image.Config{Board: b, KernelPackage: c.kernelPackage, Init: c.init, Binaries: image.BinariesIn(c.bin), OutDir: c.out, Version: c.version, Progress: stdout, NetbootArgs: netboot,
		Release: c.release, SignKey: key, OCIArchives: archives, Conformance: conformance})
	if err != nil {
		return err
	}
	fmt.Fprintf(stdout, "image for %s in %s\n  kernel %s\n  verity root hash %s\n", m.Board, c.out, m.KernelVersion, m.Verity.RootHash)
	if key != nil {
		fmt.Fprintf(stdout, "  release %d, signed by release key %s\n", m.Release, m.ReleaseKey)
	} else {
		fmt.Fprintf(stdout, "  unsigned: no node installs it as an update (-sign-key)\n")
	}
	for _, name := range []string{image.KernelFile, image.InitramfsFile, image.SystemFile} {
		a := m.Artefacts[name]
		fmt.Fprintf(stdout, "  %-14s %8.1f MiB  sha256 %s\n", name, float64(a.Size)/(1<<20), a.SHA256[:16])
	}
	for _, img := range m.ContainerImages {
		fmt.Fprintf(stdout, "  image %s %s\n", img.Ref, img.Digest)
	}
	return nil
}

// netbootParameters reads a parameters file for the network-boot UKI,
// which every node booting it shares: only register parameters without a
// node's own settings (a hostname, a static address) make sense there.
func netbootParameters(file string) (string, error) {
	raw, err := os.ReadFile(file)
	if err != nil {
		return "", fmt.Errorf("-params: %w", err)
	}
	p, err := parameters.Decode(raw)
	if err != nil {
		return "", fmt.Errorf("-params %s: %w", file, err)
	}
	switch {
	case p.GetRegister() == nil:
		return "", fmt.Errorf("-params %s: the network-boot UKI is shared by every node that boots it, so its parameters must register with a cluster (plinthctl params -register), not bootstrap one", file)
	case p.GetNetwork().GetHostname() != "" || p.GetNetwork().GetStatic() != nil:
		return "", fmt.Errorf("-params %s: a hostname or static address would be every booting node's: leave them out of shared parameters", file)
	}
	return parameters.CmdlineKey + "=" + parameters.CmdlineValue(raw), nil
}
