//go:build built

package image

import (
	"context"
	"crypto/ed25519"
	"crypto/rand"
	"encoding/json"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"

	"plinth.dev/plinth/board"
	"plinth.dev/plinth/internal/testutil/ocitest"
	"plinth.dev/plinth/platform/layout"
	"plinth.dev/plinth/platform/verity"
)

// These tests use the real kernel package of the default board, which
// `make unit` fetches into PLINTH_KERNEL_PACKAGE_DIR.

var (
	kernelOnce sync.Once
	kernel     *Kernel
	kernelDeb  string
	kernelErr  error
)

func testKernel(t *testing.T) (*Kernel, string) {
	t.Helper()
	kernelOnce.Do(func() {
		b, _ := board.Get(board.Default)
		dir := os.Getenv("PLINTH_KERNEL_PACKAGE_DIR")
		if dir == "" {
			dir = "../out/cache"
		}
		m, _ := filepath.Glob(filepath.Join(dir, b.KernelPackage+"_*.deb"))
		if len(m) == 0 {
			kernelErr = os.ErrNotExist
			return
		}
		kernelDeb = m[0]
		kernel, kernelErr = ReadKernelPackage(kernelDeb)
	})
	if kernelErr != nil {
		t.Fatalf("kernel package of %s: %v (run `make unit`, which fetches it)", board.Default, kernelErr)
	}
	return kernel, kernelDeb
}

func names(ms []*Module) []string {
	var n []string
	for _, m := range ms {
		n = append(n, m.Name)
	}
	return n
}

func TestModuleClosureOnRealKernel(t *testing.T) {
	k, _ := testKernel(t)
	if len(k.Modules) < 500 || k.Image == nil || !strings.HasSuffix(k.Version, "cloud-amd64") {
		t.Fatalf("kernel package read wrong: %d modules, version %q", len(k.Modules), k.Version)
	}
	mods, err := k.Closure([]string{"dm_crypt", "virtio_net"})
	if err != nil {
		t.Fatal(err)
	}
	n := names(mods)
	pos := func(name string) int { return slices.Index(n, name) }
	for _, pair := range [][2]string{{"dm_mod", "dm_crypt"}, {"virtio", "virtio_net"}, {"net_failover", "virtio_net"}, {"failover", "net_failover"}} {
		if pos(pair[0]) < 0 || pos(pair[0]) > pos(pair[1]) {
			t.Errorf("%s must be loaded before %s; order %v", pair[0], pair[1], n)
		}
	}
	// Built-in modules are not listed; unknown ones are an error.
	if got, err := k.Closure([]string{"ext4"}); err != nil || len(got) != 0 {
		t.Errorf("built-in ext4: %v, %v", names(got), err)
	}
	if _, err := k.Closure([]string{"no_such_module"}); err == nil || !strings.Contains(err.Error(), "no_such_module") {
		t.Errorf("unknown module: %v", err)
	}
	b, _ := board.Get(board.Default)
	if _, err := k.Closure(slices.Concat(b.EarlyModules, b.SystemModules, b.KubernetesModules)); err != nil {
		t.Errorf("board %s modules: %v", b.Name, err)
	}
}

func TestBuildContentsAndManifest(t *testing.T) {
	_, deb := testKernel(t)
	initBin := os.Getenv("PLINTH_INIT")
	if initBin == "" {
		t.Fatal("PLINTH_INIT unset: run `make unit`, which builds out/bin/init")
	}
	b, _ := board.Get(board.Default)
	out := t.TempDir()
	bins, content := standInBinaries(t)
	var progress strings.Builder
	pub, key, _ := ed25519.GenerateKey(rand.Reader)
	// A user's image, as another tool writes it, named by a short
	// reference (--oci-archive).
	user := writeOCITestArchive(t, "app.tar", ocitest.Entry{Image: testImage(t, "amd64", "user"), Annotations: refName("app:1.0")})
	m, err := Build(context.Background(), Config{Board: b, KernelPackage: deb, Init: initBin, Binaries: bins, OutDir: out, Version: "test", Progress: &progress,
		NetbootArgs: []string{testNetbootArg}, Release: 41, SignKey: key, OCIArchives: []OCIArchive{{Path: user}}})
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(progress.String(), "[9/9] done") {
		t.Errorf("progress output:\n%s", progress.String())
	}

	// Manifest on disk equals the returned one and matches the files.
	var onDisk Manifest
	data, _ := os.ReadFile(filepath.Join(out, ManifestFile))
	if err := json.Unmarshal(data, &onDisk); err != nil {
		t.Fatal(err)
	}
	for name, a := range onDisk.Artefacts {
		got, err := hashFile(filepath.Join(out, name))
		if err != nil || got != a {
			t.Errorf("manifest says %s is %+v, file is %+v (%v)", name, a, got, err)
		}
	}
	if !strings.Contains(m.Cmdline, "plinth.verity=") || !strings.Contains(m.Cmdline, "console=ttyS0") {
		t.Errorf("cmdline %q", m.Cmdline)
	}
	args := strings.Fields(m.Cmdline)
	p, err := verity.ParseParams(strings.TrimPrefix(args[len(args)-1], "plinth.verity="))
	if err != nil || p.String() != strings.TrimPrefix(args[len(args)-1], "plinth.verity=") {
		t.Fatalf("verity params on cmdline: %v", err)
	}
	if st, _ := os.Stat(filepath.Join(out, SystemFile)); st.Size() != int64(p.HashStartBlock+p.HashBlocks())*verity.BlockSize {
		t.Errorf("system image size %d does not match its verity params", st.Size())
	}

	// Initramfs: system image first and intact, then init, modules, load list.
	ir := filepath.Join(out, InitramfsFile)
	off, size, err := SystemImageExtent(ir)
	if err != nil {
		t.Fatal(err)
	}
	irData, _ := os.ReadFile(ir)
	sys, _ := os.ReadFile(filepath.Join(out, SystemFile))
	if size != int64(len(sys)) || string(irData[off:off+size]) != string(sys) {
		t.Error("system image in the initramfs differs from system.img")
	}
	entries, err := ListInitramfs(ir)
	if err != nil {
		t.Fatal(err)
	}
	want := []string{layout.SystemImagePath, "init", "dev/console", layout.ModuleLoadList, "newroot", "proc"}
	for _, mod := range m.EarlyModules {
		k, _ := testKernel(t)
		want = append(want, modulePath(m.KernelVersion, k.Modules[mod].Path))
	}
	for _, w := range want {
		if !slices.Contains(entries, w) {
			t.Errorf("initramfs lacks %s", w)
		}
	}
	for _, e := range entries {
		if e == "." {
			t.Error("initramfs must not carry a '.' entry: it would change the rootfs mode")
		}
	}
	if len(m.EarlyModules) < len(b.EarlyModules) || !slices.Contains(m.EarlyModules, "dm_mod") {
		t.Errorf("early modules %v", m.EarlyModules)
	}
	checkKubernetesContents(t, m, filepath.Join(out, SystemFile), content)
	checkSigned(t, out, m, pub, 41)
	k, _ := testKernel(t)
	checkUKIs(t, out, m, k.Image)
	checkDisk(t, out, m)
	checkWriteDisk(t, out, m)
}

func TestBuildRefusesWrongKernel(t *testing.T) {
	_, deb := testKernel(t)
	b := *must(board.Get(board.Default))
	b.KernelPackage = "linux-image-9.9.9-other"
	bins, _ := standInBinaries(t)
	_, err := Build(context.Background(), Config{Board: &b, KernelPackage: deb, Init: deb, Binaries: bins, OutDir: t.TempDir()})
	if err == nil || !strings.Contains(err.Error(), "board") {
		t.Fatalf("mismatched kernel accepted: %v", err)
	}
	if _, err := ReadKernelPackage(os.Args[0]); err == nil {
		t.Fatal("a non-Debian file was accepted as kernel package")
	}
}
