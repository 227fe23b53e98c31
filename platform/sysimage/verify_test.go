package sysimage

import (
	"bytes"
	"context"
	"errors"
	"io"
	"os"
	"path/filepath"
	"syscall"
	"testing"
	"time"

	"plinth.dev/plinth/platform/verity"
)

// The device-mapper half needs a kernel with dm-verity (the VM tests boot
// it); the pacing and error reporting are tested here on plain readers.

// badReader fails every read that touches block bad with EIO, as
// dm-verity does for a block that does not match its hash.
type badReader struct {
	r     io.ReaderAt
	bad   int64
	reads int
}

func (b *badReader) ReadAt(p []byte, off int64) (int, error) {
	b.reads++
	if b.bad >= 0 && off <= b.bad*verity.BlockSize && b.bad*verity.BlockSize < off+int64(len(p)) {
		return 0, syscall.EIO
	}
	return b.r.ReadAt(p, off)
}

func TestReadPacedFindsTheBadBlock(t *testing.T) {
	const size = 64 * verity.BlockSize
	data := bytes.NewReader(make([]byte, size))
	var slept []time.Duration
	sleep := func(_ context.Context, d time.Duration) error { slept = append(slept, d); return nil }
	p := Pace{Chunk: 16 * verity.BlockSize, Busy: 0.5}.withDefaults()

	v, err := readPaced(context.Background(), &badReader{r: data, bad: -1}, size, p, sleep)
	if err != nil || v.Bytes != size || v.BadBlock != -1 {
		t.Fatalf("clean device: %+v %v", v, err)
	}
	// A delay first, then one pause per chunk.
	if len(slept) != 1+4 {
		t.Errorf("slept %d times, want 5: %v", len(slept), slept)
	}

	v, err = readPaced(context.Background(), &badReader{r: data, bad: 37}, size, p, sleep)
	if !errors.Is(err, ErrTampered) || v.BadBlock != 37 || v.Bytes != 32*verity.BlockSize {
		t.Fatalf("bad block 37: %+v %v", v, err)
	}
	if want := "block 37 (byte 151552)"; !bytes.Contains([]byte(err.Error()), []byte(want)) {
		t.Errorf("error %q does not name %s", err, want)
	}
	// A device that ends early is not a clean read.
	if _, err := readPaced(context.Background(), &badReader{r: bytes.NewReader(make([]byte, size/2)), bad: -1}, size, p, sleep); !errors.Is(err, ErrTampered) {
		t.Errorf("short device: %v", err)
	}
}

func TestReadPacedStopsWhenCancelled(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	r := &badReader{r: bytes.NewReader(make([]byte, 1<<20)), bad: -1}
	n := 0
	sleep := func(ctx context.Context, d time.Duration) error {
		if n++; n == 3 {
			cancel()
		}
		return sleepCtx(ctx, d)
	}
	v, err := readPaced(ctx, r, 1<<20, Pace{Chunk: 64 << 10}.withDefaults(), sleep)
	if !errors.Is(err, context.Canceled) || v.Bytes != 2*64<<10 {
		t.Errorf("cancelled: %+v %v", v, err)
	}
}

func TestPaceKeepsTheDutyCycle(t *testing.T) {
	p := Pace{Chunk: 4096, Busy: 0.2}.withDefaults()
	slow := &slowReader{d: 2 * time.Millisecond}
	var slept time.Duration
	sleep := func(_ context.Context, d time.Duration) error { slept += d; return nil }
	v, err := readPaced(context.Background(), slow, 10*4096, p, sleep)
	if err != nil {
		t.Fatal(err)
	}
	// 80 % of the time pausing: four times the busy time.
	if ratio := float64(slept) / float64(v.Busy); ratio < 3.9 || ratio > 4.1 {
		t.Errorf("slept %v for %v busy (ratio %.2f, want 4)", slept, v.Busy, ratio)
	}
	if d := (Pace{Chunk: 1000, Busy: 7}).withDefaults(); d.Chunk != 1<<20 || d.Busy != 0.25 {
		t.Errorf("defaults: %+v", d)
	}
}

type slowReader struct{ d time.Duration }

func (s *slowReader) ReadAt(p []byte, _ int64) (int, error) {
	time.Sleep(s.d)
	return len(p), nil
}

// Verify on a regular file: no device-mapper status, and O_DIRECT is used
// where the filesystem allows it.
func TestVerifyFile(t *testing.T) {
	p := filepath.Join(t.TempDir(), "img")
	if err := os.WriteFile(p, make([]byte, 256<<10), 0o644); err != nil {
		t.Fatal(err)
	}
	v, err := Verify(context.Background(), p, 256<<10, Pace{Chunk: 64 << 10, Busy: 1})
	if err != nil || v.Bytes != 256<<10 {
		t.Fatalf("%+v %v", v, err)
	}
}
