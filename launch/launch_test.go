//go:build built

package launch

import (
	"compress/gzip"
	"context"
	"errors"
	"io"
	"os"
	"path/filepath"
	"reflect"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"
)

// TestQEMUDiskArgs: disks take PCI slots in the order given, with serials.
func TestQEMUDiskArgs(t *testing.T) {
	o := NodeOptions{DiskPath: "/d/a,b.img", Disks: []Disk{{Path: "/d/second.img", Serial: "S2"}}}
	var got []string
	args := qemuArgs(o, "/s/qmp", "", false, 0)
	for i := 0; i+1 < len(args); i++ {
		if args[i] == "-drive" || args[i] == "-device" && strings.HasPrefix(args[i+1], "virtio-blk") {
			got = append(got, args[i], args[i+1])
		}
	}
	want := []string{
		"-drive", "if=none,id=disk0,format=raw,cache=unsafe,file=/d/a,,b.img", "-device", "virtio-blk-pci,drive=disk0",
		"-drive", "if=none,id=disk1,format=raw,cache=unsafe,file=/d/second.img", "-device", "virtio-blk-pci,drive=disk1,serial=S2",
	}
	if !reflect.DeepEqual(got, want) {
		t.Errorf("disk arguments\n got %q\nwant %q", got, want)
	}
}

func TestConsoleLines(t *testing.T) {
	f, err := os.Create(filepath.Join(t.TempDir(), "console.log"))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	n := &Node{opts: NodeOptions{Name: "fake"}, consoleLog: f, exited: make(chan struct{}), changed: make(chan struct{})}
	w := consoleSink{n}
	for _, s := range []string{"one\r\n", "tw", "o\r\r\nthree\nfou"} {
		if k, err := w.Write([]byte(s)); k != len(s) || err != nil {
			t.Fatalf("Write = %d, %v", k, err)
		}
	}
	if got := strings.Join(n.Lines(), "|"); got != "one|two|three" {
		t.Errorf("lines = %q", got)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
	defer cancel()
	// "fou" has no newline yet, so it must not match.
	_, err = n.WaitForLine(ctx, regexp.MustCompile(`fou`))
	if !errors.Is(err, context.DeadlineExceeded) || !strings.Contains(err.Error(), "fou⏎") {
		t.Errorf("partial line: %v", err)
	}
	go func() {
		time.Sleep(20 * time.Millisecond)
		w.Write([]byte("r\nfive\n"))
	}()
	ctx2, cancel2 := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel2()
	m, idx, err := n.WaitForLineAfter(ctx2, 1, regexp.MustCompile(`^(f\w+)$`))
	if err != nil || m[1] != "four" || idx != 3 {
		t.Errorf("WaitForLineAfter = %v %d %v", m, idx, err)
	}
	if _, idx, _ := n.WaitForLineAfter(ctx2, idx+1, regexp.MustCompile(`^f`)); idx != 4 {
		t.Errorf("next match at %d, want 4", idx)
	}
}

func TestBareInitramfsFormat(t *testing.T) {
	dir := t.TempDir()
	bin := filepath.Join(dir, "bin")
	data := []byte("#!fake init, odd length")
	if err := os.WriteFile(bin, data, 0o644); err != nil {
		t.Fatal(err)
	}
	out := filepath.Join(dir, "i.cpio.gz")
	if err := BuildBareInitramfs(bin, out); err != nil {
		t.Fatal(err)
	}
	f, err := os.Open(out)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	zr, err := gzip.NewReader(f)
	if err != nil {
		t.Fatal(err)
	}
	if zr.Name != "" || !zr.ModTime.IsZero() {
		t.Errorf("gzip header has name %q mtime %v", zr.Name, zr.ModTime)
	}
	raw, err := io.ReadAll(zr)
	if err != nil {
		t.Fatal(err)
	}
	type entry struct {
		name string
		mode uint64
		data string
	}
	var got []entry
	for off := 0; ; {
		h := string(raw[off : off+110])
		if h[:6] != "070701" {
			t.Fatalf("bad magic at %d: %q", off, h[:6])
		}
		field := func(i int) uint64 {
			v, err := strconv.ParseUint(h[6+8*i:14+8*i], 16, 32)
			if err != nil {
				t.Fatal(err)
			}
			return v
		}
		mode, size, namesize := field(1), int(field(6)), int(field(11))
		name := string(raw[off+110 : off+110+namesize-1])
		off = (off + 110 + namesize + 3) &^ 3
		got = append(got, entry{name, mode, string(raw[off : off+size])})
		off = (off + size + 3) &^ 3
		if name == "TRAILER!!!" {
			if off != len(raw) {
				t.Errorf("%d bytes after trailer", len(raw)-off)
			}
			break
		}
	}
	want := []entry{{"dev", 0o40755, ""}, {"proc", 0o40755, ""}, {"init", 0o100755, string(data)}, {"TRAILER!!!", 0, ""}}
	if len(got) != len(want) {
		t.Fatalf("entries = %v", got)
	}
	for i := range want {
		if got[i] != want[i] {
			t.Errorf("entry %d = %+v, want %+v", i, got[i], want[i])
		}
	}
}
