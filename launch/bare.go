package launch

import (
	"bufio"
	"compress/gzip"
	"fmt"
	"io"
	"os"
	"path"
	"path/filepath"
	"strings"
)

// BuildBareInitramfs writes a gzip'd newc cpio archive holding only /dev,
// /proc and initBinary as /init. It exists for the "bare boot" benchmark,
// which measures kernel-to-userspace time without any of Plinth's own
// initramfs, so the archive is written by hand rather than with a tool
// that might not be installed.
func BuildBareInitramfs(initBinary, out string) error {
	return BuildInitramfs(initBinary, out, true)
}

// InitramfsFile is a file of a bare initramfs besides /init.
type InitramfsFile struct {
	// Name is its path in the archive, without a leading slash
	// ("etc/hosts"); missing parent directories are added (0755).
	Name string
	// Mode is its permission bits (0644 if zero).
	Mode os.FileMode
	// Data is its contents, unless Source is set.
	Data []byte
	// Source is a file on the host copied in (streamed: it may be the
	// 150 MB kube binary).
	Source string
}

// BuildInitramfs is BuildBareInitramfs with more files (after /dev, /proc
// and /init, in this order), gzip'd only if gz: the kernel takes an
// uncompressed newc archive as well, and unpacking one is much cheaper
// under TCG when it holds a large binary.
func BuildInitramfs(initBinary, out string, gz bool, files ...InitramfsFile) error {
	initData, err := os.ReadFile(initBinary)
	if err != nil {
		return fmt.Errorf("bare initramfs: %w", err)
	}
	tmp, err := os.CreateTemp(filepath.Dir(out), ".initramfs-*")
	if err != nil {
		return fmt.Errorf("bare initramfs: %w", err)
	}
	defer os.Remove(tmp.Name()) // no-op after the rename

	bw := bufio.NewWriterSize(tmp, 1<<20)
	var w io.Writer = bw
	var zw *gzip.Writer
	if gz {
		// A zero gzip header (no name, no mtime) keeps the output reproducible.
		zw = gzip.NewWriter(bw)
		w = zw
	}
	cw := &cpioWriter{w: w}
	cw.entry("dev", 0o040755, nil)
	cw.entry("proc", 0o040755, nil)
	cw.entry("init", 0o100755, initData)
	dirs := map[string]bool{"dev": true, "proc": true}
	for _, f := range files {
		name := strings.TrimPrefix(path.Clean("/"+f.Name), "/")
		var parents []string
		for d := path.Dir(name); d != "." && !dirs[d]; d = path.Dir(d) {
			parents = append(parents, d)
		}
		for i := len(parents) - 1; i >= 0; i-- {
			dirs[parents[i]] = true
			cw.entry(parents[i], 0o040755, nil)
		}
		mode := uint32(f.Mode.Perm())
		if mode == 0 {
			mode = 0o644
		}
		if f.Source == "" {
			cw.entry(name, 0o100000|mode, f.Data)
			continue
		}
		if cw.err == nil {
			cw.err = cw.copyFile(name, 0o100000|mode, f.Source)
		}
	}
	cw.entry("TRAILER!!!", 0, nil)
	if cw.err == nil && zw != nil {
		cw.err = zw.Close()
	}
	if cw.err == nil {
		cw.err = bw.Flush()
	}
	if cerr := tmp.Close(); cw.err == nil {
		cw.err = cerr
	}
	if cw.err != nil {
		return fmt.Errorf("bare initramfs: %w", cw.err)
	}
	if err := os.Rename(tmp.Name(), out); err != nil {
		return fmt.Errorf("bare initramfs: %w", err)
	}
	return nil
}

// cpioWriter emits the "newc" (SVR4, no CRC) format the kernel unpacks.
type cpioWriter struct {
	w   io.Writer
	ino int
	err error
}

func (c *cpioWriter) write(b []byte) {
	if c.err == nil {
		_, c.err = c.w.Write(b)
	}
}

// pad aligns to 4 bytes, as newc requires after the name and after data.
func (c *cpioWriter) pad(n int) {
	if r := n % 4; r != 0 {
		c.write(make([]byte, 4-r))
	}
}

func (c *cpioWriter) entry(name string, mode uint32, data []byte) {
	c.header(name, mode, len(data))
	c.write(data)
	c.pad(len(data))
}

// copyFile is entry with the contents of the host file src.
func (c *cpioWriter) copyFile(name string, mode uint32, src string) error {
	f, err := os.Open(src)
	if err != nil {
		return err
	}
	defer f.Close()
	st, err := f.Stat()
	if err != nil {
		return err
	}
	if st.Size() > 0xffffffff {
		return fmt.Errorf("%s: too large for newc (%d bytes)", src, st.Size())
	}
	size := int(st.Size())
	c.header(name, mode, size)
	if c.err != nil {
		return c.err
	}
	n, err := io.Copy(c.w, io.LimitReader(f, int64(size)))
	if err == nil && n != int64(size) {
		err = fmt.Errorf("%s: changed while copied (%d of %d bytes)", src, n, size)
	}
	if err != nil {
		return err
	}
	c.pad(size)
	return c.err
}

func (c *cpioWriter) header(name string, mode uint32, size int) {
	ino, nlink := 0, 1
	if name != "TRAILER!!!" {
		c.ino++
		ino = c.ino
	}
	if mode&0o170000 == 0o040000 {
		nlink = 2
	}
	const hdrLen = 110
	namesize := len(name) + 1
	// Fields: ino mode uid gid nlink mtime filesize devmajor devminor
	// rdevmajor rdevminor namesize check. mtime 0 for reproducibility.
	hdr := fmt.Sprintf("070701%08x%08x%08x%08x%08x%08x%08x%08x%08x%08x%08x%08x%08x",
		ino, mode, 0, 0, nlink, 0, size, 0, 0, 0, 0, namesize, 0)
	c.write([]byte(hdr))
	c.write(append([]byte(name), 0))
	c.pad(hdrLen + namesize)
}
