package main

import (
	"archive/tar"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"

	"github.com/google/go-containerregistry/pkg/name"
	"github.com/google/go-containerregistry/pkg/v1/layout"

	"plinth.dev/plinth/launch"
	"plinth.dev/plinth/platform/ociarchive"
)

// The nodes carry every image the suite uses, imported and pinned, so
// nothing is pulled, except where a spec asks for imagePullPolicy Always
// (the projected pod certificate's mTLS spec): then the kubelet asks the
// registry for the manifest whatever the node has. So the runner serves
// the same images, the archive the image build wrote beside the image,
// from a registry of its own (launch.Registry), and the cluster policy
// makes it the mirror of their registries, as an owner of an offline
// cluster would:
//
//	OUT/…/conformance.tar ──► launch.Registry (TLS, its own CA) ◄── slirp guestfwd ◄── containerd on the nodes
//	plinthctl cluster policy --registry registry.k8s.io --mirror https://<guest address> --registry-ca …

// startMirror serves the images of archive (an OCI layout in a tar, as
// the image build writes it) and returns the registry and the hosts of
// the images' references.
func startMirror(archive, scratch string) (reg *launch.Registry, hosts []string, err error) {
	dir := filepath.Join(scratch, "registry-layout")
	if err := os.RemoveAll(dir); err != nil {
		return nil, nil, err
	}
	defer os.RemoveAll(dir)
	if err := untar(archive, dir); err != nil {
		return nil, nil, fmt.Errorf("%s: %w (make image-conformance writes it)", archive, err)
	}
	idx, err := layout.ImageIndexFromPath(dir)
	if err != nil {
		return nil, nil, fmt.Errorf("%s: %w", archive, err)
	}
	im, err := idx.IndexManifest()
	if err != nil {
		return nil, nil, fmt.Errorf("%s: %w", archive, err)
	}
	if reg, err = launch.StartRegistry(launch.DefaultSubnet, launch.ProxyCommand); err != nil {
		return nil, nil, err
	}
	defer func() {
		if err != nil {
			reg.Close()
			reg = nil
		}
	}()
	for _, d := range im.Manifests {
		ref, err := name.NewTag(d.Annotations[ociarchive.NameAnnotation], name.StrictValidation)
		if err != nil {
			return nil, nil, fmt.Errorf("%s: manifest %s: %w", archive, d.Digest, err)
		}
		img, err := idx.Image(d.Digest)
		if err == nil {
			_, err = reg.Push(ref.RepositoryStr(), ref.TagStr(), img)
		}
		if err != nil {
			return nil, nil, fmt.Errorf("%s: %s: %w", archive, ref, err)
		}
		if h := ref.RegistryStr(); !slices.Contains(hosts, h) {
			hosts = append(hosts, h)
		}
	}
	if len(hosts) == 0 {
		return nil, nil, fmt.Errorf("%s: no images", archive)
	}
	return reg, hosts, nil
}

// mirrorPolicy makes reg the mirror of hosts in the cluster policy.
func (c *runCmd) mirrorPolicy(ctx context.Context, cl *launch.Cluster, reg *launch.Registry, hosts []string) error {
	ca := filepath.Join(cl.OwnerDir(), "mirror-ca.pem")
	if err := os.WriteFile(ca, reg.CAPEM, 0o600); err != nil {
		return err
	}
	for _, h := range hosts {
		out, err := exec.CommandContext(ctx, c.plinthctl, "cluster", "policy", "--config", cl.OwnerDir(),
			"--registry", h, "--mirror", "https://"+reg.MirrorHost(), "--registry-ca", ca).CombinedOutput()
		if err != nil {
			return fmt.Errorf("plinthctl cluster policy --registry %s: %v: %s", h, err, out)
		}
	}
	fmt.Printf("conformance: registry mirror for %s at %s\n", strings.Join(hosts, ", "), reg.MirrorHost())
	return nil
}

// untar unpacks an archive of regular files and directories into dir.
func untar(archive, dir string) error {
	f, err := os.Open(archive)
	if err != nil {
		return err
	}
	defer f.Close()
	tr := tar.NewReader(f)
	for {
		h, err := tr.Next()
		if errors.Is(err, io.EOF) {
			return nil
		}
		if err != nil {
			return err
		}
		p := filepath.Join(dir, filepath.FromSlash(h.Name))
		if !strings.HasPrefix(p, filepath.Clean(dir)+string(filepath.Separator)) {
			return fmt.Errorf("entry %q leaves the archive", h.Name)
		}
		switch h.Typeflag {
		case tar.TypeDir:
			err = os.MkdirAll(p, 0o755)
		case tar.TypeReg:
			err = writeEntry(p, tr)
		default:
			err = fmt.Errorf("entry %q is neither file nor directory", h.Name)
		}
		if err != nil {
			return err
		}
	}
}

func writeEntry(p string, r io.Reader) error {
	if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
		return err
	}
	f, err := os.Create(p)
	if err != nil {
		return err
	}
	if _, err := io.Copy(f, r); err != nil {
		f.Close()
		return err
	}
	return f.Close()
}
