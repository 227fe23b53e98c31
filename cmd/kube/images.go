package main

import (
	"context"
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"time"

	containerd "github.com/containerd/containerd/v2/client"
)

// runImportImages is `kube import-images -address SOCKET DIR`: it imports
// every OCI image archive in DIR (the builder's, from the system image)
// into containerd's k8s.io namespace and unpacks it, so the kubelet finds
// the pause and test images without a registry. Importing an image that
// is there already changes nothing.
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
		fmt.Printf("imported %s (%s)\n", img.Name, img.Target.Digest)
	}
	return nil
}
