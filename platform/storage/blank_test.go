package storage

import (
	"bytes"
	"errors"
	"io"
	"os"
	"path/filepath"
	"testing"
)

func TestIsBlank(t *testing.T) {
	d := make([]byte, 300<<10)
	r := bytes.NewReader(d)
	for _, c := range []struct{ off, n int64 }{{0, 0}, {0, 1}, {0, int64(len(d))}, {1000, 70 << 10}, {int64(len(d)) - 1, 1}} {
		if blank, err := IsBlank(r, c.off, c.n); !blank || err != nil {
			t.Errorf("zeros %+v: %v %v", c, blank, err)
		}
	}
	d[200<<10] = 1
	if blank, err := IsBlank(r, 0, int64(len(d))); blank || err != nil {
		t.Errorf("one byte set: %v %v", blank, err)
	}
	if blank, err := IsBlank(r, 0, 200<<10); !blank || err != nil {
		t.Errorf("range before the byte: %v %v", blank, err)
	}
	if blank, err := IsBlank(r, 200<<10, 1); blank || err != nil {
		t.Errorf("the byte itself: %v %v", blank, err)
	}
	// Past the end is an error, never "blank".
	if blank, err := IsBlank(r, int64(len(d))-10, 20); blank || !errors.Is(err, io.ErrUnexpectedEOF) {
		t.Errorf("past the end: %v %v", blank, err)
	}
	if _, err := IsBlank(r, -1, 1); err == nil {
		t.Error("negative offset accepted")
	}
}

func TestDiskIsBlank(t *testing.T) {
	const size = 8 << 20
	for name, c := range map[string]struct {
		off   int64
		blank bool
	}{
		"zero disk":         {-1, true},
		"MBR signature":     {510, false},
		"ext4 superblock":   {1024 + 56, false},
		"btrfs superblock":  {64<<10 + 64, false},
		"end of first MiB":  {1<<20 - 1, false},
		"middle":            {4 << 20, true}, // not looked at
		"GPT backup header": {size - 512, false},
		"start of last MiB": {size - 1<<20, false},
		"before last MiB":   {size - 1<<20 - 1, true},
	} {
		d := make([]byte, size)
		if c.off >= 0 {
			d[c.off] = 0xff
		}
		blank, err := DiskIsBlank(bytes.NewReader(d), size)
		if err != nil || blank != c.blank {
			t.Errorf("%s: blank %v (%v), want %v", name, blank, err, c.blank)
		}
	}
	// Small disks: the ranges overlap and cover everything.
	small := make([]byte, 4096)
	if blank, err := DiskIsBlank(bytes.NewReader(small), 4096); !blank || err != nil {
		t.Errorf("small zero disk: %v %v", blank, err)
	}
	small[2000] = 1
	if blank, _ := DiskIsBlank(bytes.NewReader(small), 4096); blank {
		t.Error("small disk with data is blank")
	}
	if _, err := DiskIsBlank(bytes.NewReader(small), 0); err == nil {
		t.Error("size 0 accepted")
	}
	// A device shorter than its claimed size is an error.
	if blank, err := DiskIsBlank(bytes.NewReader(make([]byte, 1<<20)), 4<<20); blank || err == nil {
		t.Errorf("short device: %v %v", blank, err)
	}
}

// TestDiskIsBlankFile checks a sparse file, the usual test disk.
func TestDiskIsBlankFile(t *testing.T) {
	p := filepath.Join(t.TempDir(), "disk")
	f, err := os.Create(p)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if err := f.Truncate(1 << 30); err != nil {
		t.Fatal(err)
	}
	if blank, err := DiskIsBlank(f, 1<<30); !blank || err != nil {
		t.Fatalf("sparse file: %v %v", blank, err)
	}
	if _, err := f.WriteAt([]byte{1}, 1<<30-100); err != nil {
		t.Fatal(err)
	}
	if blank, err := DiskIsBlank(f, 1<<30); blank || err != nil {
		t.Fatalf("after write at the end: %v %v", blank, err)
	}
}
