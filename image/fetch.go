package image

import (
	"context"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
)

// FetchKernelPackage returns the path of the board's kernel package pkg
// in cacheDir (FetchPackage).
func FetchKernelPackage(ctx context.Context, pkg, cacheDir string, progress io.Writer) (string, error) {
	p, err := FetchPackage(ctx, pkg, cacheDir, progress)
	if err != nil {
		return "", fmt.Errorf("%w (the board pins this kernel package; if the archive dropped it, bump the board's KernelPackage)", err)
	}
	return p, nil
}

// FetchPackage returns the path of the Debian package pkg in cacheDir,
// downloading it with `apt-get download` when it is not there.
func FetchPackage(ctx context.Context, pkg, cacheDir string, progress io.Writer) (string, error) {
	if progress == nil {
		progress = io.Discard
	}
	find := func() string {
		m, _ := filepath.Glob(filepath.Join(cacheDir, pkg+"_*.deb"))
		if len(m) == 0 {
			return ""
		}
		return m[len(m)-1]
	}
	if p := find(); p != "" {
		return p, nil
	}
	if err := os.MkdirAll(cacheDir, 0o755); err != nil {
		return "", err
	}
	download := func() ([]byte, error) {
		cmd := exec.CommandContext(ctx, "apt-get", "download", pkg)
		cmd.Dir = cacheDir
		return cmd.CombinedOutput()
	}
	fmt.Fprintf(progress, "fetching package %s into %s\n", pkg, cacheDir)
	out, err := download()
	if err != nil {
		// A fresh machine has no package lists yet.
		fmt.Fprintln(progress, "apt-get download failed; updating package lists and retrying")
		if upd, uerr := exec.CommandContext(ctx, "apt-get", "update", "-qq").CombinedOutput(); uerr != nil {
			return "", fmt.Errorf("apt-get update: %v: %s", uerr, strings.TrimSpace(string(upd)))
		}
		out, err = download()
	}
	if err != nil {
		return "", fmt.Errorf("apt-get download %s: %v: %s", pkg, err, strings.TrimSpace(string(out)))
	}
	if p := find(); p != "" {
		return p, nil
	}
	return "", fmt.Errorf("apt-get download %s left no .deb in %s", pkg, cacheDir)
}
