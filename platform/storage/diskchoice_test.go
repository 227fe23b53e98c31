package storage

import (
	"bytes"
	"context"
	"errors"
	"log/slog"
	"strings"
	"sync"
	"testing"
	"time"

	"plinth.dev/plinth/platform/gpt"
	"plinth.dev/plinth/platform/layout"
)

func blankDisk(name, serial string) DiskInfo {
	return DiskInfo{Name: name, Path: "/dev/" + name, Serial: serial, Size: 1 << 30, Blank: true}
}

func plinthDisk(name, serial string) DiskInfo {
	return DiskInfo{Name: name, Path: "/dev/" + name, Serial: serial, Size: 1 << 30, Plinth: true}
}

func flashedDisk(name, serial string) DiskInfo {
	return DiskInfo{Name: name, Path: "/dev/" + name, Serial: serial, Size: 1 << 30, Flashed: true}
}

func foreignDisk(name, serial string) DiskInfo {
	return DiskInfo{Name: name, Path: "/dev/" + name, Serial: serial, Size: 1 << 30, Note: "data but no GPT"}
}

func TestChooseDataDisk(t *testing.T) {
	for _, c := range []struct {
		name  string
		disks []DiskInfo
		want  string // storage.data_disk
		pick  string // chosen disk, or "" for an error
		err   error
		say   []string // the error names these
	}{
		// Without storage.data_disk.
		{"only disk, blank", []DiskInfo{blankDisk("vda", "")}, "", "vda", nil, nil},
		{"only disk, ours", []DiskInfo{plinthDisk("vda", "")}, "", "vda", nil, nil},
		{"ours beside a blank disk probed first", []DiskInfo{blankDisk("vda", ""), plinthDisk("vdb", "")}, "", "vdb", nil, nil},
		{"ours beside a foreign disk", []DiskInfo{foreignDisk("sda", ""), plinthDisk("sdb", "")}, "", "sdb", nil, nil},
		{"two of ours", []DiskInfo{plinthDisk("vda", "A"), plinthDisk("vdb", "B")}, "", "", ErrDataDiskAmbiguous, []string{"vda", "vdb", "storage.data_disk"}},
		{"two blank", []DiskInfo{blankDisk("vda", ""), blankDisk("vdb", "")}, "", "", ErrDataDiskAmbiguous, []string{"vda", "vdb", "storage.data_disk"}},
		{"blank beside foreign", []DiskInfo{foreignDisk("vda", ""), blankDisk("vdb", "")}, "", "", ErrDataDiskAmbiguous, []string{"vda", "vdb", "storage.data_disk"}},
		{"only disk, foreign", []DiskInfo{foreignDisk("vda", "")}, "", "", ErrNoDataDisk, []string{"vda", "wipe"}},
		{"two foreign", []DiskInfo{foreignDisk("vda", ""), foreignDisk("vdb", "")}, "", "", ErrNoDataDisk, []string{"vda", "vdb"}},
		{"no disk", nil, "", "", ErrNoDataDisk, []string{"no disk"}},
		{"flashed disk beside a blank one", []DiskInfo{blankDisk("vda", ""), flashedDisk("vdb", "")}, "", "vdb", nil, nil},
		{"ours beside a flashed disk", []DiskInfo{flashedDisk("vda", ""), plinthDisk("vdb", "")}, "", "vdb", nil, nil},
		{"two flashed", []DiskInfo{flashedDisk("vda", ""), flashedDisk("vdb", "")}, "", "", ErrDataDiskAmbiguous, []string{"vda", "vdb", "storage.data_disk"}},

		// With storage.data_disk.
		{"named blank by name", []DiskInfo{blankDisk("vda", ""), blankDisk("vdb", "")}, "vdb", "vdb", nil, nil},
		{"named blank by serial", []DiskInfo{blankDisk("vda", "S1"), blankDisk("vdb", "S2")}, "S2", "vdb", nil, nil},
		{"named blank beside foreign", []DiskInfo{foreignDisk("vda", ""), blankDisk("vdb", "")}, "vdb", "vdb", nil, nil},
		{"named ours among two of ours", []DiskInfo{plinthDisk("vda", "A"), plinthDisk("vdb", "B")}, "B", "vdb", nil, nil},
		{"named ours beside blank", []DiskInfo{blankDisk("vda", ""), plinthDisk("vdb", "")}, "vdb", "vdb", nil, nil},
		{"named flashed", []DiskInfo{flashedDisk("vda", ""), flashedDisk("vdb", "")}, "vdb", "vdb", nil, nil},
		{"named blank beside a flashed disk", []DiskInfo{flashedDisk("vda", ""), blankDisk("vdb", "")}, "vdb", "vdb", nil, nil},
		{"named blank while another is ours", []DiskInfo{plinthDisk("vda", ""), blankDisk("vdb", "")}, "vdb", "", ErrDataDiskConflict, []string{"vda", "vdb"}},
		{"named foreign", []DiskInfo{foreignDisk("vda", ""), blankDisk("vdb", "")}, "vda", "", ErrNoDataDisk, []string{"vda", "wipe"}},
		{"named missing", []DiskInfo{blankDisk("vda", "")}, "vdb", "", ErrDataDiskNotFound, []string{`"vdb"`, "vda"}},
		{"name matches two", []DiskInfo{blankDisk("vda", "vdb"), blankDisk("vdb", "")}, "vdb", "", ErrDataDiskAmbiguous, []string{"vda", "vdb"}},
		{"serial is not matched when empty", []DiskInfo{blankDisk("vda", ""), blankDisk("vdb", "")}, "", "", ErrDataDiskAmbiguous, nil},
	} {
		d, err := ChooseDataDisk(c.disks, c.want)
		if c.pick != "" {
			if err != nil || d.Name != c.pick {
				t.Errorf("%s: chose %q (%v), want %s", c.name, d.Name, err, c.pick)
			}
			continue
		}
		if !errors.Is(err, c.err) || !errors.Is(err, ErrDataDiskChoice) || d.Name != "" {
			t.Errorf("%s: chose %q, %v; want %v", c.name, d.Name, err, c.err)
			continue
		}
		for _, s := range c.say {
			if !strings.Contains(err.Error(), s) {
				t.Errorf("%s: error does not mention %q: %v", c.name, s, err)
			}
		}
	}
}

// fakeScans returns the disk sets in turn, then the last one forever.
type fakeScans struct {
	mu    sync.Mutex
	steps [][]DiskInfo
	n     int
}

func (f *fakeScans) scan() ([]DiskInfo, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	s := f.steps[min(f.n, len(f.steps)-1)]
	f.n++
	return s, nil
}

func TestWaitForDataDisk(t *testing.T) {
	const settle, timeout, interval = 300 * time.Millisecond, time.Second, 5 * time.Millisecond
	blankA, ours := blankDisk("vda", ""), plinthDisk("vdb", "")
	for _, c := range []struct {
		name  string
		steps [][]DiskInfo
		want  string
		pick  string
		err   error
	}{
		// The blank disk is probed first; the node's own disk shows up a
		// few scans later, before the set would count as settled.
		{"own disk probed late", [][]DiskInfo{{blankA}, {blankA}, {blankA}, {blankA, ours}}, "", "vdb", nil},
		{"a disk appears late", [][]DiskInfo{{}, {}, {}, {blankA}}, "", "vda", nil},
		{"second blank disk probed late", [][]DiskInfo{{blankA}, {blankA}, {blankA, blankDisk("vdb", "")}}, "", "", ErrDataDiskAmbiguous},
		{"named disk probed late", [][]DiskInfo{{blankA}, {blankA}, {blankA}, {blankA, blankDisk("vdb", "S")}}, "S", "vdb", nil},
		{"named disk never comes", [][]DiskInfo{{blankA}}, "S", "", ErrDataDiskNotFound},
		{"no disk ever", [][]DiskInfo{{}}, "", "", ErrNoDataDisk},
	} {
		f := &fakeScans{steps: c.steps}
		start := time.Now()
		var logs bytes.Buffer
		d, err := waitForDataDisk(context.Background(), f.scan, c.want, slog.New(slog.NewTextHandler(&logs, nil)), settle, timeout, interval)
		took := time.Since(start)
		if c.pick != "" {
			if err != nil || d.Name != c.pick {
				t.Errorf("%s: chose %q (%v), want %s", c.name, d.Name, err, c.pick)
			}
		} else if !errors.Is(err, c.err) {
			t.Errorf("%s: chose %q, %v; want %v", c.name, d.Name, err, c.err)
		}
		// Nothing but a Plinth disk is decided before the disks settled.
		if c.pick != "vdb" || c.want != "" {
			if took < settle {
				t.Errorf("%s: decided after %v, before the disks settled", c.name, took)
			}
		}
		if (errors.Is(err, ErrDataDiskNotFound) || c.name == "no disk ever") && took < timeout {
			t.Errorf("%s: gave up after %v, before the timeout", c.name, took)
		}
		if c.name != "own disk probed late" && !strings.Contains(logs.String(), "storage: waiting for") {
			t.Errorf("%s: the console does not say what it waits for:\n%s", c.name, logs.String())
		}
	}
	// Disks that keep changing never yield a blank disk.
	var steps [][]DiskInfo
	for i := range 400 {
		ds := []DiskInfo{blankA}
		if i%2 == 1 {
			ds = append(ds, blankDisk("vdc", ""))
		}
		steps = append(steps, ds)
	}
	f := &fakeScans{steps: steps}
	if d, err := waitForDataDisk(context.Background(), f.scan, "", slog.New(slog.DiscardHandler), settle, timeout, interval); !errors.Is(err, ErrDataDiskChoice) {
		t.Errorf("flapping disks: chose %q, %v", d.Name, err)
	}
}

func TestDescribeContent(t *testing.T) {
	const size = gapDiskSize
	gapped := gapImage(t)
	withoutPlinth := make(mem0, size)
	tab := gpt.NewTable(gapDiskID, gpt.Partition{Type: linuxFSType, ID: partA, FirstLBA: 2048, LastLBA: 4095})
	if err := gpt.Write(withoutPlinth, size, tab); err != nil {
		t.Fatal(err)
	}
	corrupt := append(mem0(nil), withoutPlinth...)
	corrupt[512+20] ^= 1              // primary header CRC
	corrupt[len(corrupt)-512+20] ^= 1 // backup header CRC
	flashed := make(mem0, size)
	tab = gpt.NewTable(gapDiskID, gpt.Partition{Type: gpt.MustParseGUID(layout.ESPType), ID: partA, FirstLBA: 2048, LastLBA: 4095},
		gpt.Partition{Type: gpt.MustParseGUID(layout.SystemSlotType), ID: partB, FirstLBA: 4096, LastLBA: 6143})
	if err := gpt.Write(flashed, size, tab); err != nil {
		t.Fatal(err)
	}
	foreign := make(mem0, size)
	copy(foreign[1024+56:], "\x53\xef") // ext4 magic
	for name, c := range map[string]struct {
		r interface {
			ReadAt([]byte, int64) (int, error)
		}
		blank, plinth, flashed bool
		note                   string
	}{
		"blank":           {make(mem0, size), true, false, false, ""},
		"plinth with gap": {gapped, false, true, false, ""},
		"flashed":         {flashed, false, false, true, ""},
		"gpt, no plinth":  {withoutPlinth, false, false, false, "none a Plinth data partition"},
		"corrupt gpt":     {corrupt, false, false, false, "corrupt"},
		"foreign":         {foreign, false, false, false, "no GPT"},
	} {
		d, err := describeContent(c.r, size)
		if err != nil || d.Blank != c.blank || d.Plinth != c.plinth || d.Flashed != c.flashed || !strings.Contains(d.Note, c.note) {
			t.Errorf("%s: %+v err %v", name, d, err)
		}
	}
	// A disk shorter than it claims is an I/O error, not blank.
	if _, err := describeContent(make(mem0, 1<<20), size); err == nil {
		t.Error("short device described")
	}
}

// mem0 is a byte-slice disk.
type mem0 []byte

func (m mem0) ReadAt(b []byte, off int64) (int, error) {
	if off >= int64(len(m)) {
		return 0, errors.New("EOF")
	}
	n := copy(b, m[off:])
	if n < len(b) {
		return n, errors.New("short read")
	}
	return n, nil
}

func (m mem0) WriteAt(b []byte, off int64) (int, error) { return copy(m[off:], b), nil }
