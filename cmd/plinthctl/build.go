package main

import (
	"context"
	"crypto/ed25519"
	"fmt"
	"io"
	"os"
	"path/filepath"

	"github.com/spf13/pflag"

	"plinth.dev/plinth/board"
	"plinth.dev/plinth/image"
	"plinth.dev/plinth/roleserver/parameters"
)

func init() {
	add(spec{path: "build", short: "Build a node image (kernel, initramfs with system image, manifest)", group: groupImage,
		long: "Build a node image for one board with the image builder: the kernel of the board's Debian\n" +
			"kernel package, an initramfs holding /init and the system image, and the manifest.\n" +
			"With --sign-key and --release it signs the image as release N: nodes install only\n" +
			"images one of their cluster's release keys signed, and none older than what they run.",
		maxArgs: 0, new: func() command { return new(buildCmd) }})
}

// buildCmd is `plinthctl build`: the image builder (package image) for
// one board. With --sign-key and --release it signs the image as release
// N (manifest.sig; the system image carries the key and the number).
type buildCmd struct {
	fs            *pflag.FlagSet // for Changed("release")
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

func (c *buildCmd) flags(fs *pflag.FlagSet) {
	c.fs = fs
	fs.StringVar(&c.board, "board", board.Default, "`board` to build for")
	fs.StringVar(&c.kernelPackage, "kernel-package", "", "`path` of the board's Debian kernel package (default: fetched into --cache)")
	fs.StringVar(&c.cache, "cache", "", "`directory` for downloaded kernel packages (default OUT/cache, "+outHelp+")")
	fs.StringVar(&c.init, "init", "", "static /init `binary`, required (make builds out/bin/init)")
	fs.StringVar(&c.bin, "bin", "", "`directory` with kube, containerd, containerd-shim-runc-v2, crun, cni/{host-local,loopback,portmap,ptp} and testpod, required (make builds them in out/bin)")
	fs.StringVar(&c.out, "out", "", "output `directory` (default OUT/image/BOARD, "+outHelp+")")
	fs.StringVar(&c.version, "version", "dev", "`version` recorded in the image")
	fs.StringVar(&c.params, "params", "", "a cluster's register parameters `file` (plinthctl params --register), put into the network-boot UKI's measured command line: one plinth.efi for every node that boots it")
	fs.StringVar(&c.signKey, "sign-key", "", "release key `file` (plinthctl release key FILE) that signs the image: nodes install only images their cluster's release keys signed")
	fs.Uint64Var(&c.release, "release", 0, "release `number` of the image, required with --sign-key: nodes refuse an update to an older release (0: unreleased)")
	fs.Var(&c.ociArchives, "oci-archive", "OCI image archive `FILE[=REF]` (docker save, skopeo copy oci-archive:, crane) carried in the system image, imported and pinned at boot: pods of its images start without a registry (repeat). REF names the archive's one image when its index gives only a tag")
	fs.StringVar(&c.conformance, "conformance-images", "", "add the upstream Kubernetes conformance tests' images, made from the programs in `DIR` (make e2e builds out/bin/conformance: agnhost, e2etools, nnp, busybox)")
}

// check refuses wrong usage before anything is read or built, and fills
// in the defaults under OUT.
func (c *buildCmd) check() error {
	switch {
	case c.init == "":
		return usagef("--init is required (make builds out/bin/init)")
	case c.bin == "":
		return usagef("--bin is required: the directory of the Kubernetes binaries and testpod (make builds them in out/bin)")
	case c.signKey != "" && !c.fs.Changed("release"):
		return usagef("--sign-key needs --release N: the number that orders this image among the signed ones (nodes refuse older ones)")
	}
	if c.cache == "" {
		c.cache = filepath.Join(outDir(), "cache")
	}
	if c.out == "" {
		c.out = filepath.Join(outDir(), "image", c.board)
	}
	return nil
}

func (c *buildCmd) run(ctx context.Context, e *env, _ []string) error {
	if err := c.check(); err != nil {
		return err
	}
	b, err := board.Get(c.board)
	if err != nil {
		return usageError{err}
	}
	var archives []image.OCIArchive
	for _, a := range c.ociArchives {
		arch, err := image.ParseOCIArchive(a)
		if err != nil {
			return usageError{err}
		}
		archives = append(archives, arch)
	}
	var key ed25519.PrivateKey
	if c.signKey != "" {
		if key, err = readReleaseKey(c.signKey); err != nil {
			return fmt.Errorf("--sign-key: %w", err)
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
	if c.kernelPackage == "" {
		if c.kernelPackage, err = image.FetchKernelPackage(ctx, b.KernelPackage, c.cache, e.stdout); err != nil {
			return err
		}
	}
	var conformance *image.ConformanceInputs
	if c.conformance != "" {
		conformance = &image.ConformanceInputs{Dir: c.conformance}
	}
	m, err := image.Build(ctx, image.Config{Board: b, KernelPackage: c.kernelPackage, Init: c.init, Binaries: image.BinariesIn(c.bin), OutDir: c.out, Version: c.version, Progress: e.stdout, NetbootArgs: netboot,
		Release: c.release, SignKey: key, OCIArchives: archives, Conformance: conformance})
	if err != nil {
		return err
	}
	c.summary(e.stdout, m, key != nil)
	return nil
}

// summary prints what was built.
func (c *buildCmd) summary(w io.Writer, m *image.Manifest, signed bool) {
	fmt.Fprintf(w, "image for %s in %s\n  kernel %s\n  verity root hash %s\n", m.Board, c.out, m.KernelVersion, m.Verity.RootHash)
	if signed {
		fmt.Fprintf(w, "  release %d, signed by release key %s\n", m.Release, m.ReleaseKey)
	} else {
		fmt.Fprintf(w, "  unsigned: no node installs it as an update (--sign-key)\n")
	}
	for _, name := range []string{image.KernelFile, image.InitramfsFile, image.SystemFile} {
		a := m.Artefacts[name]
		fmt.Fprintf(w, "  %-14s %8.1f MiB  sha256 %s\n", name, float64(a.Size)/(1<<20), a.SHA256[:16])
	}
	for _, img := range m.ContainerImages {
		fmt.Fprintf(w, "  image %s %s\n", img.Ref, img.Digest)
	}
}

// netbootParameters reads a parameters file for the network-boot UKI,
// which every node booting it shares: only register parameters without a
// node's own settings (a hostname, a static address) make sense there.
func netbootParameters(file string) (string, error) {
	raw, err := os.ReadFile(file)
	if err != nil {
		return "", fmt.Errorf("--params: %w", err)
	}
	p, err := parameters.Decode(raw)
	if err != nil {
		return "", fmt.Errorf("--params %s: %w", file, err)
	}
	switch {
	case p.GetRegister() == nil:
		return "", fmt.Errorf("--params %s: the network-boot UKI is shared by every node that boots it, so its parameters must register with a cluster (plinthctl params --register), not bootstrap one", file)
	case p.GetNetwork().GetHostname() != "" || p.GetNetwork().GetStatic() != nil:
		return "", fmt.Errorf("--params %s: a hostname or static address would be every booting node's: leave them out of shared parameters", file)
	}
	return parameters.CmdlineKey + "=" + parameters.CmdlineValue(raw), nil
}
