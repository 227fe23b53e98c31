// Package kmod loads kernel modules in an order computed at build time.
//
// Debian's kernel package ships no modules.dep, so the image builder
// resolves dependencies from each module's .modinfo and writes a load list;
// the node only walks that list with finit_module(2).
package kmod

import (
	"bufio"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"

	"golang.org/x/sys/unix"
)

// Load loads one module file. A module that is already loaded is fine.
func Load(path string) error {
	f, err := os.Open(path)
	if err != nil {
		return err
	}
	defer f.Close()
	if err := unix.FinitModule(int(f.Fd()), "", 0); err != nil && !errors.Is(err, unix.EEXIST) {
		return fmt.Errorf("loading %s: %w", filepath.Base(path), err)
	}
	return nil
}

// LoadList loads, in order, the modules named in listFile (paths relative
// to dir, one per line). A driver for hardware this machine lacks (ENODEV,
// e.g. aesni_intel on a CPU without AES-NI) is skipped and reported; any
// other failure stops the list, as later modules may depend on it.
func LoadList(dir, listFile string) (loaded, skipped []string, err error) {
	f, err := os.Open(listFile)
	if err != nil {
		return nil, nil, err
	}
	defer f.Close()
	s := bufio.NewScanner(f)
	for s.Scan() {
		rel := strings.TrimSpace(s.Text())
		if rel == "" || strings.HasPrefix(rel, "#") {
			continue
		}
		name := strings.TrimSuffix(filepath.Base(rel), ".ko")
		if err := Load(filepath.Join(dir, rel)); errors.Is(err, unix.ENODEV) {
			skipped = append(skipped, name)
			continue
		} else if err != nil {
			return loaded, skipped, err
		}
		loaded = append(loaded, name)
	}
	return loaded, skipped, s.Err()
}

// IndexFile is the builder's module index in /lib/modules/VERSION: one line
// per module, "NAME PATH DEP,DEP" (deps are module names, "-" for none).
const IndexFile = "modules.plinth"

// Loaded reports whether a module (by name, underscores) is loaded.
func Loaded(name string) bool {
	_, err := os.Stat(filepath.Join("/sys/module", name))
	return err == nil
}

// LoadByName loads a module and, first, its dependencies, using the
// index in dir. Modules already loaded are skipped.
func LoadByName(dir, name string) error {
	idx, err := readIndex(filepath.Join(dir, IndexFile))
	if err != nil {
		return err
	}
	var load func(n string, depth int) error
	load = func(n string, depth int) error {
		if Loaded(n) {
			return nil
		}
		e, ok := idx[n]
		if !ok {
			return fmt.Errorf("module %s is not in %s", n, filepath.Join(dir, IndexFile))
		}
		if depth > 32 {
			return fmt.Errorf("module %s: dependency chain too deep", n)
		}
		for _, d := range e.deps {
			if err := load(d, depth+1); err != nil {
				return err
			}
		}
		return Load(filepath.Join(dir, e.path))
	}
	return load(strings.ReplaceAll(name, "-", "_"), 0)
}

type indexEntry struct {
	path string
	deps []string
}

func readIndex(p string) (map[string]indexEntry, error) {
	f, err := os.Open(p)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	idx := map[string]indexEntry{}
	s := bufio.NewScanner(f)
	for s.Scan() {
		fields := strings.Fields(s.Text())
		if len(fields) != 3 {
			continue
		}
		e := indexEntry{path: fields[1]}
		if fields[2] != "-" {
			e.deps = strings.Split(fields[2], ",")
		}
		idx[fields[0]] = e
	}
	return idx, s.Err()
}
