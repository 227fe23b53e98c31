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
// to dir, one per line). It stops at the first failure: later modules may
// depend on it.
func LoadList(dir, listFile string) ([]string, error) {
	f, err := os.Open(listFile)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	var loaded []string
	s := bufio.NewScanner(f)
	for s.Scan() {
		rel := strings.TrimSpace(s.Text())
		if rel == "" || strings.HasPrefix(rel, "#") {
			continue
		}
		if err := Load(filepath.Join(dir, rel)); err != nil {
			return loaded, err
		}
		loaded = append(loaded, strings.TrimSuffix(filepath.Base(rel), ".ko"))
	}
	return loaded, s.Err()
}
