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
