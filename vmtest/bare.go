package vmtest

import (
	"bufio"
	"compress/gzip"
	"fmt"
	"io"
	"os"
	"path/filepath"
)

// BuildBareInitramfs writes a gzip'd newc cpio archive holding only /dev,
// /proc and initBinary as /init. It exists for the "bare boot" benchmark,
// which measures kernel-to-userspace time without any of Plinth's own
// initramfs, so the archive is written by hand rather than with a tool
// that might not be installed.
func BuildBareInitramfs(initBinary, out string) error {
	initData, err := os.ReadFile(initBinary)
	if err != nil {
		return fmt.Errorf("bare initramfs: %w", err)
	}
	tmp, err := os.CreateTemp(filepath.Dir(out), ".initramfs-*")
	if err != nil {
		return fmt.Errorf("bare initramfs: %w", err)
	}
	defer os.Remove(tmp.Name()) // no-op after the rename

	bw := bufio.NewWriter(tmp)
	// A zero gzip header (no name, no mtime) keeps the output reproducible.
	zw := gzip.NewWriter(bw)
	cw := &cpioWriter{w: zw}
	cw.entry("dev", 0o040755, nil)
	cw.entry("proc", 0o040755, nil)
	cw.entry("init", 0o100755, initData)
	cw.entry("TRAILER!!!", 0, nil)
	if cw.err == nil {
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
		ino, mode, 0, 0, nlink, 0, len(data), 0, 0, 0, 0, namesize, 0)
	c.write([]byte(hdr))
	c.write(append([]byte(name), 0))
	c.pad(hdrLen + namesize)
	c.write(data)
	c.pad(len(data))
}
