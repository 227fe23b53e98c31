package image

import (
	"archive/tar"
	"bufio"
	"bytes"
	"compress/gzip"
	"debug/elf"
	"errors"
	"fmt"
	"io"
	"os"
	"path"
	"sort"
	"strconv"
	"strings"

	"github.com/ulikunitz/xz"
)

// Kernel is what the builder takes from a Debian kernel package.
type Kernel struct {
	// Version is the module directory name, e.g. "6.1.0-57-cloud-amd64".
	Version string
	Image   []byte // boot/vmlinuz-*
	// Modules by module name (underscores, as in .modinfo "name=").
	Modules map[string]*Module
	// Builtin names modules compiled into the kernel.
	Builtin map[string]bool
}

// Module is one loadable kernel module.
type Module struct {
	Name    string
	Path    string // relative to lib/modules/VERSION/
	Data    []byte
	Depends []string
	// SoftPre are "softdep=pre:" modules: not required to load, but the
	// module works badly without them (e.g. crypto drivers).
	SoftPre []string
}

// ReadKernelPackage unpacks a Debian linux-image .deb: an ar archive whose
// data.tar.* member holds boot/vmlinuz-* and lib/modules/*.
func ReadKernelPackage(debPath string) (*Kernel, error) {
	k := &Kernel{Modules: map[string]*Module{}, Builtin: map[string]bool{}}
	err := walkDebData(debPath, func(p string, t io.Reader) error {
		switch {
		case strings.HasPrefix(p, "boot/vmlinuz-"):
			var err error
			k.Image, err = io.ReadAll(t)
			return err
		case strings.HasPrefix(p, "lib/modules/"):
			rest := strings.TrimPrefix(p, "lib/modules/")
			ver, rel, _ := strings.Cut(rest, "/")
			k.Version = ver
			switch {
			case strings.HasSuffix(rel, ".ko"):
				b, err := io.ReadAll(t)
				if err != nil {
					return err
				}
				m, err := parseModule(rel, b)
				if err != nil {
					return err
				}
				k.Modules[m.Name] = m
			case rel == "modules.builtin":
				b, err := io.ReadAll(t)
				if err != nil {
					return err
				}
				for _, l := range strings.Fields(string(b)) {
					k.Builtin[moduleName(path.Base(l))] = true
				}
			}
		}
		return nil
	})
	if err != nil {
		return nil, err
	}
	if k.Image == nil || k.Version == "" {
		return nil, fmt.Errorf("%s: no boot/vmlinuz-* or lib/modules in the package", debPath)
	}
	return k, nil
}

// walkDebData calls visit for every regular file of a .deb's data.tar.*
// (its path without "./").
func walkDebData(debPath string, visit func(p string, r io.Reader) error) error {
	f, err := os.Open(debPath)
	if err != nil {
		return err
	}
	defer f.Close()
	data, name, err := findArMember(bufio.NewReader(f), "data.tar")
	if err != nil {
		return fmt.Errorf("%s: %w", debPath, err)
	}
	var tr io.Reader
	switch {
	case strings.HasSuffix(name, ".xz"):
		tr, err = xz.NewReader(data)
	case strings.HasSuffix(name, ".gz"):
		tr, err = gzip.NewReader(data)
	case name == "data.tar":
		tr = data
	default:
		err = fmt.Errorf("unsupported compression of %s", name)
	}
	if err != nil {
		return fmt.Errorf("%s: %w", debPath, err)
	}
	t := tar.NewReader(tr)
	for {
		h, err := t.Next()
		if err == io.EOF {
			return nil
		}
		if err != nil {
			return fmt.Errorf("%s: reading %s: %w", debPath, name, err)
		}
		if h.Typeflag != tar.TypeReg {
			continue
		}
		if err := visit(strings.TrimPrefix(h.Name, "./"), t); err != nil {
			return err
		}
	}
}

// findArMember returns a reader over the first ar member whose name starts
// with prefix.
func findArMember(r *bufio.Reader, prefix string) (io.Reader, string, error) {
	magic := make([]byte, 8)
	if _, err := io.ReadFull(r, magic); err != nil || string(magic) != "!<arch>\n" {
		return nil, "", errors.New("not a Debian package (ar magic missing)")
	}
	hdr := make([]byte, 60)
	for {
		if _, err := io.ReadFull(r, hdr); err != nil {
			return nil, "", fmt.Errorf("no %s* member", prefix)
		}
		name := strings.TrimRight(strings.TrimSpace(string(hdr[0:16])), "/")
		size, err := strconv.ParseInt(strings.TrimSpace(string(hdr[48:58])), 10, 64)
		if err != nil || string(hdr[58:60]) != "`\n" {
			return nil, "", errors.New("corrupt ar member header")
		}
		if strings.HasPrefix(name, prefix) {
			return io.LimitReader(r, size), name, nil
		}
		// Members are 2-byte aligned.
		if _, err := r.Discard(int(size + size%2)); err != nil {
			return nil, "", err
		}
	}
}

func moduleName(file string) string {
	n := strings.TrimSuffix(file, ".ko")
	return strings.ReplaceAll(n, "-", "_")
}

// parseModule reads the .modinfo ELF section: NUL-separated key=value.
func parseModule(rel string, data []byte) (*Module, error) {
	m := &Module{Name: moduleName(path.Base(rel)), Path: rel, Data: data}
	ef, err := elf.NewFile(bytes.NewReader(data))
	if err != nil {
		return nil, fmt.Errorf("module %s: %w", rel, err)
	}
	sec := ef.Section(".modinfo")
	if sec == nil {
		return nil, fmt.Errorf("module %s: no .modinfo section", rel)
	}
	info, err := sec.Data()
	if err != nil {
		return nil, fmt.Errorf("module %s: %w", rel, err)
	}
	for _, kv := range bytes.Split(info, []byte{0}) {
		k, v, ok := strings.Cut(string(kv), "=")
		if !ok {
			continue
		}
		switch k {
		case "name":
			m.Name = v
		case "depends":
			for _, d := range strings.Split(v, ",") {
				if d != "" {
					m.Depends = append(m.Depends, d)
				}
			}
		case "softdep":
			// "pre: a b post: c"
			pre := false
			for _, w := range strings.Fields(v) {
				switch w {
				case "pre:":
					pre = true
				case "post:":
					pre = false
				default:
					if pre {
						m.SoftPre = append(m.SoftPre, moduleName(w))
					}
				}
			}
		}
	}
	return m, nil
}

// Closure returns the modules needed to load names, dependencies before
// the modules that need them. Built-in names are dropped; unknown names
// are an error. Soft pre-dependencies are included when they exist as
// modules.
func (k *Kernel) Closure(names []string) ([]*Module, error) {
	var order []*Module
	state := map[string]int{} // 1 visiting, 2 done
	var visit func(n string, chain []string, soft bool) error
	visit = func(n string, chain []string, soft bool) error {
		n = moduleName(n)
		switch state[n] {
		case 2:
			return nil
		case 1:
			if soft {
				return nil
			}
			return fmt.Errorf("module dependency cycle: %s", strings.Join(append(chain, n), " -> "))
		}
		m, ok := k.Modules[n]
		if !ok {
			if k.Builtin[n] || soft {
				return nil
			}
			return fmt.Errorf("module %s (needed by %s) is neither in kernel %s nor built in", n, strings.Join(chain, " -> "), k.Version)
		}
		state[n] = 1
		deps := append([]string(nil), m.Depends...)
		sort.Strings(deps)
		for _, d := range deps {
			if err := visit(d, append(chain, n), false); err != nil {
				return err
			}
		}
		for _, d := range m.SoftPre {
			if err := visit(d, append(chain, n), true); err != nil {
				return err
			}
		}
		state[n] = 2
		order = append(order, m)
		return nil
	}
	for _, n := range names {
		if err := visit(n, nil, false); err != nil {
			return nil, err
		}
	}
	return order, nil
}
