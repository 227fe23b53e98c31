// Command userimage writes the VM tests' user image: the test workload
// (cmd/testpod) under a user's reference, as an OCI image archive from
// another writer than the builder's (ocitest), which make carries into
// the update test's next image with plinthctl build --oci-archive.
//
//	userimage -testpod out/bin/testpod -ref REF -o out/user-image.tar
package main

import (
	"flag"
	"fmt"
	"os"
	"runtime"

	"plinth.dev/plinth/image"
	"plinth.dev/plinth/internal/testutil/ocitest"
)

func main() {
	testpod := flag.String("testpod", "", "the test workload's static binary")
	ref := flag.String("ref", "", "the image's full reference, written as the index's org.opencontainers.image.ref.name")
	out := flag.String("o", "", "archive to write")
	arch := flag.String("arch", runtime.GOARCH, "GOARCH of the image")
	flag.Parse()
	if err := run(*testpod, *ref, *out, *arch); err != nil {
		fmt.Fprintln(os.Stderr, "userimage:", err)
		os.Exit(1)
	}
}

func run(testpod, ref, out, arch string) error {
	if testpod == "" || ref == "" || out == "" {
		return fmt.Errorf("-testpod, -ref and -o are required")
	}
	bin, err := os.ReadFile(testpod)
	if err != nil {
		return err
	}
	img, err := image.TestPodImage(bin, arch)
	if err != nil {
		return err
	}
	// Another image than the node's own test image: its own image ID.
	if img, err = ocitest.Labelled(img, "dev.plinth.vmtest", "a user's image"); err != nil {
		return err
	}
	return ocitest.WriteArchive(out, ocitest.Entry{Image: img, Annotations: map[string]string{ocitest.RefNameAnnotation: ref}})
}
