package main

import (
	"context"
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"time"

	containerd "github.com/containerd/containerd/v2/client"

	"plinth.dev/plinth/platform/ociarchive"
)

// runImportImages is `kube import-images -address SOCKET DIR`: it imports
// every OCI image archive in DIR (the builder's, from the system image)
// into containerd's k8s.io namespace and unpacks it, so the kubelet finds
// the pause and test images without a registry, and pins them
// (io.cri-containerd.pinned=pinned: the kubelet's image garbage
// collection never removes what no registry can give back). An archive
// whose image is in the store already, with the same digest and
// unpacked, is not read at all: the store is on /data, so after the
// first boot of an image version the import costs nothing.
func runImportImages(args []string) int {
	fs := flag.NewFlagSet("import-images", flag.ContinueOnError)
	address := fs.String("address", "", "containerd socket")
	if err := fs.Parse(args); err != nil || *address == "" || fs.NArg() != 1 {
		fmt.Fprintln(os.Stderr, "usage: kube import-images -address SOCKET DIR")
		return 2
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	client, err := containerd.New(*address, containerd.WithDefaultNamespace("k8s.io"))
	if err != nil {
		fmt.Fprintln(os.Stderr, "import-images:", err)
		return 1
	}
	defer client.Close()
	archives, err := filepath.Glob(filepath.Join(fs.Arg(0), "*.tar"))
	if err != nil || len(archives) == 0 {
		fmt.Fprintln(os.Stderr, "import-images: no image archives in", fs.Arg(0), err)
		return 1
	}
	for _, a := range archives {
		if err := importArchive(ctx, client, a); err != nil {
			fmt.Fprintf(os.Stderr, "import-images: %s: %v\n", a, err)
			return 1
		}
	}
	return 0
}

func importArchive(ctx context.Context, client *containerd.Client, path string) error {
	refs, err := ociarchive.Refs(path)
	if err != nil {
		return err
	}
	if present(ctx, client, refs) {
		for _, r := range refs {
			if err := pin(ctx, client, r.Name); err != nil {
				return err
			}
			fmt.Printf("present %s (%s), pinned\n", r.Name, r.Digest)
		}
		return nil
	}
	f, err := os.Open(path)
	if err != nil {
		return err
	}
	defer f.Close()
	imgs, err := client.Import(ctx, f, containerd.WithAllPlatforms(false))
	if err != nil {
		return err
	}
	for _, img := range imgs {
		image := containerd.NewImage(client, img)
		if err := image.Unpack(ctx, "overlayfs"); err != nil {
			return fmt.Errorf("unpacking %s: %w", img.Name, err)
		}
		if err := pin(ctx, client, img.Name); err != nil {
			return err
		}
		fmt.Printf("imported %s (%s), pinned\n", img.Name, img.Target.Digest)
	}
	return nil
}

// pinnedLabel is the CRI plugin's label of images the kubelet must never
// garbage-collect.
const pinnedLabel = "io.cri-containerd.pinned"

// pin labels image name pinned (keeping its other labels).
func pin(ctx context.Context, client *containerd.Client, name string) error {
	is := client.ImageService()
	img, err := is.Get(ctx, name)
	if err != nil {
		return err
	}
	if img.Labels[pinnedLabel] == "pinned" {
		return nil
	}
	if img.Labels == nil {
		img.Labels = map[string]string{}
	}
	img.Labels[pinnedLabel] = "pinned"
	_, err = is.Update(ctx, img, "labels."+pinnedLabel)
	return err
}

// present reports whether every image of refs is in the store with that
// digest, unpacked.
func present(ctx context.Context, client *containerd.Client, refs []ociarchive.Ref) bool {
	for _, r := range refs {
		img, err := client.GetImage(ctx, r.Name)
		if err != nil || img.Target().Digest.String() != r.Digest {
			return false
		}
		if ok, err := img.IsUnpacked(ctx, "overlayfs"); err != nil || !ok {
			return false
		}
	}
	return len(refs) > 0
}
