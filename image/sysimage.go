package image

import (
	"context"
	"crypto/ed25519"
	"crypto/sha256"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"time"

	"plinth.dev/plinth/platform/kmod"
	"plinth.dev/plinth/platform/layout"
	"plinth.dev/plinth/platform/verity"
)

// The system image is a squashfs holding everything the node runs after
// /init switches root into it. It is the read-only root filesystem:
// writable places (/run, /tmp, /data, /ephemeral) are mount points, and
// files that must change at run time are symlinks into /run.

// sysFile is one entry of the system image tree.
type sysFile struct {
	Path string // relative, no leading slash
	Data []byte
	// Source is a build host file to copy instead of Data (big binaries
	// are streamed, never held in memory).
	Source  string
	Mode    os.FileMode // 0 for symlinks
	Symlink string
}

// systemDirs are the mount points and skeleton of the root filesystem.
var systemDirs = []string{
	"dev", "proc", "sys", "run", "tmp", "data", "ephemeral", "etc", "etc/ssl/certs",
	"lib/modules", "usr/bin", "usr/lib", "var",
	// The Kubernetes worker's mounts (layout.KubeletDir, CNICacheDir).
	"var/lib", strings.TrimPrefix(layout.KubeletDir, "/"), strings.TrimPrefix(layout.CNICacheDir, "/"),
}

func systemTree(b *buildState) ([]sysFile, error) {
	files := []sysFile{
		// PLINTH_RELEASE: the release an update may not go below
		// (platform/update.CheckRelease).
		{Path: strings.TrimPrefix(layout.HostsFile, "/"), Mode: 0o644, Data: []byte(layout.HostsFileContent)},
		{Path: strings.TrimPrefix(layout.OSReleasePath, "/"), Mode: 0o644, Data: []byte(fmt.Sprintf(
			"NAME=Plinth\nID=plinth\nPRETTY_NAME=\"Plinth (%s)\"\nVERSION_ID=%s\nPLINTH_BOARD=%s\nPLINTH_RELEASE=%d\n", b.board.Name, b.version, b.board.Name, b.Release))},
	}
	// The key that signed this image, which a node's chain of release
	// keys must lead from, and the first key set of a cluster the image
	// founds (signed by it: ed25519 is deterministic, so the bytes
	// are the same at every build).
	if b.SignKey != nil {
		genesis, err := releaseGenesisFile(b.SignKey)
		if err != nil {
			return nil, err
		}
		files = append(files, sysFile{Path: strings.TrimPrefix(layout.ReleaseKeyPath, "/"), Mode: 0o644, Data: releaseKeyFile(b.SignKey.Public().(ed25519.PublicKey))},
			sysFile{Path: strings.TrimPrefix(layout.ReleaseGenesisPath, "/"), Mode: 0o644, Data: genesis})
	}
	// Files that change at run time, and directories elsewhere: relative
	// links, so they resolve in the staging tree as on the node.
	for _, l := range layout.SystemLinks {
		rel, err := filepath.Rel(filepath.Dir(l.Path), l.Target)
		if err != nil {
			return nil, err
		}
		files = append(files, sysFile{Path: strings.TrimPrefix(l.Path, "/"), Symlink: rel})
	}
	if b.caCerts != nil {
		files = append(files, sysFile{Path: "etc/ssl/certs/ca-certificates.crt", Mode: 0o644, Data: b.caCerts})
	}
	for _, m := range b.systemModules {
		files = append(files, sysFile{Path: modulePath(b.kernel.Version, m.Path), Mode: 0o644, Data: m.Data})
	}
	files = append(files, sysFile{Path: modulePath(b.kernel.Version, kmod.IndexFile), Mode: 0o644, Data: moduleIndex(b.systemModules)})
	files = append(files, sysFile{Path: strings.TrimPrefix(layout.KubernetesModuleLoadList, "/"), Mode: 0o644, Data: moduleLoadList(b.kubeModules)})
	files = append(files, b.kubeFiles...)
	tools, err := hostToolFiles(b.board.HostFiles)
	if err != nil {
		return nil, err
	}
	return append(files, tools...), nil
}

// moduleIndex lists the system image's modules for kmod.LoadByName, which
// loads them on demand (the kernel cannot: there is no modprobe).
func moduleIndex(mods []*Module) []byte {
	var b strings.Builder
	for _, m := range mods {
		deps := strings.Join(m.Depends, ",")
		if deps == "" {
			deps = "-"
		}
		fmt.Fprintf(&b, "%s %s %s\n", m.Name, m.Path, deps)
	}
	return []byte(b.String())
}

// squashfsOptions: zstd at level 9 in 256 KiB blocks, fixed times and
// owners, no xattrs. Measured on the image with Kubernetes (204 MiB of
// files, mostly Go binaries): level 9 gives 65 MiB for ~5 s of CPU, the
// default level 15 61 MiB for ~46 s and level 19 with 1 MiB blocks 58 MiB
// for ~70 s. A few MiB more initramfs cost the boot nothing measurable
// (decompression speed does not depend on the level); 40 s of every image
// build would. Bigger blocks would make every page fault of a binary
// decompress more.
var squashfsOptions = []string{
	"-comp", "zstd", "-Xcompression-level", "9", "-b", "256K", "-noappend", "-no-progress", "-quiet",
	"-all-root", "-no-xattrs", "-mkfs-time", "0", "-all-time", "0", "-no-fragments",
}

// buildSquashfs stages files in a temporary directory and runs mksquashfs
// with every timestamp and owner fixed, so the same tree gives the same
// bytes. The result is padded to a verity block and the hash tree appended.
func buildSquashfs(ctx context.Context, tmp, out string, files []sysFile, prog *progress) (verity.Params, int64, error) {
	stage := filepath.Join(tmp, "system")
	if err := os.RemoveAll(stage); err != nil {
		return verity.Params{}, 0, err
	}
	for _, d := range systemDirs {
		if err := os.MkdirAll(filepath.Join(stage, d), 0o755); err != nil {
			return verity.Params{}, 0, err
		}
	}
	for _, f := range files {
		p := filepath.Join(stage, f.Path)
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			return verity.Params{}, 0, err
		}
		var err error
		if f.Symlink != "" {
			err = os.Symlink(f.Symlink, p)
		} else if f.Source != "" {
			err = copyFile(f.Source, p, f.Mode)
		} else if err = os.WriteFile(p, f.Data, f.Mode); err == nil {
			err = os.Chmod(p, f.Mode) // umask must not change the image
		}
		if err != nil {
			return verity.Params{}, 0, err
		}
	}
	// Directories get fixed modes for the same reason.
	if err := filepath.WalkDir(stage, func(p string, d os.DirEntry, err error) error {
		if err == nil && d.IsDir() {
			err = os.Chmod(p, 0o755)
		}
		return err
	}); err != nil {
		return verity.Params{}, 0, err
	}

	os.Remove(out)
	cmd := exec.CommandContext(ctx, "mksquashfs", append([]string{stage, out}, squashfsOptions...)...)
	stop := prog.every(10*time.Second, func() string {
		st, err := os.Stat(out)
		if err != nil {
			return "mksquashfs starting"
		}
		return "mksquashfs wrote " + mib(st.Size())
	})
	msg, err := cmd.CombinedOutput()
	stop()
	if err != nil {
		return verity.Params{}, 0, fmt.Errorf("mksquashfs: %v: %s", err, strings.TrimSpace(string(msg)))
	}

	f, err := os.OpenFile(out, os.O_RDWR, 0)
	if err != nil {
		return verity.Params{}, 0, err
	}
	defer f.Close()
	st, err := f.Stat()
	if err != nil {
		return verity.Params{}, 0, err
	}
	size := (st.Size() + verity.BlockSize - 1) / verity.BlockSize * verity.BlockSize
	if err := f.Truncate(size); err != nil {
		return verity.Params{}, 0, err
	}
	// The salt only has to be unpredictable per image for an attacker who
	// cannot change the image anyway; deriving it from the contents keeps
	// the build reproducible.
	h := sha256.New()
	buf := make([]byte, 1<<20)
	for off := int64(0); off < size; off += int64(len(buf)) {
		n, _ := f.ReadAt(buf, off)
		h.Write(buf[:n])
	}
	p, err := verity.AppendTree(f, size, h.Sum(nil))
	if err != nil {
		return verity.Params{}, 0, err
	}
	return p, size, f.Sync()
}
