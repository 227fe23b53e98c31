package image

import (
	"bytes"
	"compress/gzip"
	"errors"
	"fmt"
	"io"
	"os"
	"path"
	"sort"
	"strconv"
	"strings"

	"github.com/u-root/u-root/pkg/cpio"

	"plinth.dev/plinth/platform/layout"
)

// The initramfs is two concatenated cpio archives, which the kernel unpacks
// one after the other:
//
//	[ uncompressed cpio: system.img ][ gzip( cpio: /init, /dev/console, modules, /etc/plinth/* ) ]
//
// The system image is compressed already (squashfs), so it goes in first
// and uncompressed: compressing it again costs build and boot time for no
// gain, and it sits at a fixed, easily found offset in the file.

// initramfsFile is one file of the compressed part.
type initramfsFile struct {
	Path string
	Data []byte
	Mode uint64
}

// writeSystemSegment writes the first, uncompressed archive: the system
// image alone.
func writeSystemSegment(w io.Writer, systemImage []byte) error {
	sys := []cpio.Record{cpio.StaticRecord(systemImage, cpio.Info{Name: layout.SystemImagePath, Mode: cpio.S_IFREG | 0o400})}
	return writeArchive(w, sys)
}

// writeBootSegment writes the second, compressed archive: /init, the
// device nodes and directories it needs, and files. On its own it is the
// initramfs of a disk boot, whose system image is on a slot partition.
func writeBootSegment(w io.Writer, files []initramfsFile) error {
	recs := []cpio.Record{
		cpio.CharDev("dev/console", 0o600, 5, 1),
		cpio.CharDev("dev/null", 0o666, 1, 3),
	}
	for _, d := range []string{"proc", "sys", "run", "tmp", "newroot"} {
		recs = append(recs, cpio.Directory(d, 0o755))
	}
	for _, f := range files {
		recs = append(recs, cpio.StaticRecord(f.Data, cpio.Info{Name: f.Path, Mode: cpio.S_IFREG | f.Mode}))
	}
	zw, err := gzip.NewWriterLevel(w, gzip.BestCompression)
	if err != nil {
		return err
	}
	if err := writeArchive(zw, recs); err != nil {
		return err
	}
	return zw.Close()
}

// writeArchive writes recs plus any missing parent directories (mode
// 0755: cpio.WriteRecordsAndDirs would make them 0777), parents first.
func writeArchive(w io.Writer, recs []cpio.Record) error {
	have := map[string]bool{}
	for _, r := range recs {
		have[r.Name] = true
	}
	for _, r := range recs {
		for d := path.Dir(r.Name); d != "." && d != "/" && !have[d]; d = path.Dir(d) {
			have[d] = true
			recs = append(recs, cpio.Directory(d, 0o755))
		}
	}
	sort.SliceStable(recs, func(i, j int) bool { return recs[i].Name < recs[j].Name })
	// Fixed mtimes, owners and inode numbers: same inputs, same bytes.
	cpio.MakeAllReproducible(recs)
	cw := cpio.Newc.Writer(w)
	if err := cpio.WriteRecords(cw, recs); err != nil {
		return err
	}
	return cpio.WriteTrailer(cw)
}

// SystemImageExtent returns the offset and size of the system image inside
// an initramfs written by this package (tests use it to tamper with it).
func SystemImageExtent(initramfs string) (offset, size int64, err error) {
	f, err := os.Open(initramfs)
	if err != nil {
		return 0, 0, err
	}
	defer f.Close()
	hdr := make([]byte, 110)
	if _, err := io.ReadFull(f, hdr); err != nil {
		return 0, 0, err
	}
	if string(hdr[:6]) != "070701" {
		return 0, 0, errors.New("initramfs does not start with a newc cpio header")
	}
	field := func(i int) int64 {
		v, _ := strconv.ParseInt(string(hdr[6+8*i:14+8*i]), 16, 64)
		return v
	}
	size, nameSize := field(6), field(11)
	name := make([]byte, nameSize)
	if _, err := io.ReadFull(f, name); err != nil {
		return 0, 0, err
	}
	if got := strings.TrimRight(string(name), "\x00"); got != layout.SystemImagePath {
		return 0, 0, fmt.Errorf("first initramfs entry is %q, not %s", got, layout.SystemImagePath)
	}
	offset = (110 + nameSize + 3) &^ 3
	return offset, size, nil
}

// ListInitramfs returns the paths of every entry in both archives.
func ListInitramfs(initramfs string) ([]string, error) {
	data, err := os.ReadFile(initramfs)
	if err != nil {
		return nil, err
	}
	var names []string
	r := bytes.NewReader(data)
	rr := cpio.Newc.Reader(r)
	recs, err := cpio.ReadAllRecords(rr)
	if err != nil {
		return nil, fmt.Errorf("first archive: %w", err)
	}
	var end int64
	for _, rec := range recs {
		names = append(names, rec.Name)
		end = int64(rec.FilePos) + int64(rec.FileSize)
	}
	// The trailer follows the last record; skip to the gzip magic.
	rest := data[end:]
	i := bytes.Index(rest, []byte{0x1f, 0x8b})
	if i < 0 {
		return nil, errors.New("no compressed archive after the system image")
	}
	zr, err := gzip.NewReader(bytes.NewReader(rest[i:]))
	if err != nil {
		return nil, err
	}
	plain, err := io.ReadAll(zr)
	if err != nil {
		return nil, err
	}
	recs, err = cpio.ReadAllRecords(cpio.Newc.Reader(bytes.NewReader(plain)))
	if err != nil {
		return nil, fmt.Errorf("second archive: %w", err)
	}
	for _, rec := range recs {
		names = append(names, rec.Name)
	}
	return names, nil
}

func modulePath(kver, rel string) string { return path.Join("lib/modules", kver, rel) }
