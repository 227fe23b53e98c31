package image

import (
	"debug/elf"
	"fmt"
	"os"
	"path"
	"path/filepath"
	"sort"
	"strings"

	"plinth.dev/plinth/board"
)

// Host tools are programs the node needs that Go cannot replace sensibly
// (mkfs for ext4 and XFS). The builder copies them from the build host
// with the shared libraries they need, found the way the dynamic loader
// finds them: DT_NEEDED entries, resolved in the system library
// directories, recursively, plus the ELF interpreter.

var libraryDirs = []string{"/lib/x86_64-linux-gnu", "/usr/lib/x86_64-linux-gnu", "/lib64", "/usr/lib64", "/lib", "/usr/lib"}

// hostToolFiles returns the files (programs, libraries, interpreter) for
// tools, each library once, in a fixed order.
func hostToolFiles(tools []board.HostFile) ([]sysFile, error) {
	var files []sysFile
	libs := map[string]string{} // soname or interpreter path -> host path
	var resolve func(bin string) error
	resolve = func(bin string) error {
		f, err := elf.Open(bin)
		if err != nil {
			return fmt.Errorf("host tool %s: %w", bin, err)
		}
		defer f.Close()
		for _, p := range f.Progs {
			if p.Type == elf.PT_INTERP {
				b := make([]byte, p.Filesz)
				if _, err := p.ReadAt(b, 0); err != nil {
					return err
				}
				interp := strings.TrimRight(string(b), "\x00")
				libs[interp] = interp
			}
		}
		needed, err := f.ImportedLibraries()
		if err != nil {
			return fmt.Errorf("host tool %s: %w", bin, err)
		}
		for _, so := range needed {
			if _, done := libs[so]; done {
				continue
			}
			found := ""
			for _, d := range libraryDirs {
				if _, err := os.Stat(filepath.Join(d, so)); err == nil {
					found = filepath.Join(d, so)
					break
				}
			}
			if found == "" {
				return fmt.Errorf("host tool %s needs %s, which is not installed", bin, so)
			}
			libs[so] = found
			if err := resolve(found); err != nil {
				return err
			}
		}
		return nil
	}
	for _, t := range tools {
		src, err := filepath.EvalSymlinks(t.Source)
		if err != nil {
			return nil, fmt.Errorf("host tool %s: %w (scripts/install-deps installs it)", t.Source, err)
		}
		data, err := os.ReadFile(src)
		if err != nil {
			return nil, err
		}
		mode := os.FileMode(0o644)
		if t.Executable {
			mode = 0o755
		}
		files = append(files, sysFile{Path: t.Dest, Data: data, Mode: mode})
		for _, l := range t.Links {
			rel, _ := filepath.Rel(path.Dir(l), t.Dest)
			files = append(files, sysFile{Path: l, Symlink: rel})
		}
		if !t.Executable {
			continue
		}
		if err := resolve(src); err != nil {
			return nil, err
		}
	}
	var keys []string
	for k := range libs {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	for _, k := range keys {
		host := libs[k]
		real, err := filepath.EvalSymlinks(host)
		if err != nil {
			return nil, err
		}
		data, err := os.ReadFile(real)
		if err != nil {
			return nil, err
		}
		// The loader looks a library up by the path it was found under
		// (soname in a library directory); the interpreter by its
		// absolute path.
		files = append(files, sysFile{Path: strings.TrimPrefix(host, "/"), Data: data, Mode: 0o755})
	}
	return files, nil
}
