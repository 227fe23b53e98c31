package sysimage

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"runtime"
	"time"

	"golang.org/x/sys/unix"

	"plinth.dev/plinth/platform/verity"
)

// Pace says how gently Verify reads.
type Pace struct {
	// Chunk is the size of one read (a multiple of verity.BlockSize;
	// default 1 MiB).
	Chunk int
	// Busy is the share of wall time spent reading, 0 < Busy ≤ 1
	// (default 0.25): after a read that took d, Verify sleeps
	// d·(1−Busy)/Busy. The hashing happens in the kernel's verity and loop
	// workers, not in the reading thread, so a lower scheduling priority
	// alone would not hold it back; pausing does.
	Busy float64
	// Delay is waited before the first read, so the first boot steps have
	// the CPU to themselves.
	Delay time.Duration
}

func (p Pace) withDefaults() Pace {
	if p.Chunk <= 0 || p.Chunk%verity.BlockSize != 0 {
		p.Chunk = 1 << 20
	}
	if p.Busy <= 0 || p.Busy > 1 {
		p.Busy = 0.25
	}
	return p
}

// Verify reads the whole device (size bytes) through dm-verity, paced as
// p says, and returns an error wrapping ErrTampered if any block does not
// match the root hash, naming the first such block. A cancelled ctx stops
// it with ctx.Err(). The reading thread also runs at the lowest CPU and
// I/O priority.
func Verify(ctx context.Context, dev string, size int64, p Pace) (*Verification, error) {
	type result struct {
		v   *Verification
		err error
	}
	done := make(chan result, 1)
	go func() {
		// Its own thread, never unlocked: the thread ends with this
		// goroutine instead of going back to the runtime at nice 19.
		runtime.LockOSThread()
		tid := unix.Gettid()
		unix.Setpriority(unix.PRIO_PROCESS, tid, 19)
		ioprioSetIdle(tid)
		v, err := verify(ctx, dev, size, p)
		done <- result{v, err}
	}()
	r := <-done
	return r.v, r.err
}

func verify(ctx context.Context, dev string, size int64, p Pace) (*Verification, error) {
	// O_DIRECT: the read bypasses the page cache, so it neither keeps a
	// second copy of the image in memory nor gets blocks from the cache
	// instead of from verity.
	f, err := os.OpenFile(dev, os.O_RDONLY|unix.O_DIRECT, 0)
	direct := err == nil
	if errors.Is(err, unix.EINVAL) {
		f, err = os.Open(dev)
	}
	if err != nil {
		return nil, err
	}
	defer f.Close()
	v, err := readPaced(ctx, f, size, p.withDefaults(), sleepCtx)
	v.Direct = direct
	v.Status = Status()
	if err == nil && v.Status == "C" {
		err = fmt.Errorf("%w: the kernel saw a corrupt block (verity status C)", ErrTampered)
	}
	return v, err
}

// readPaced reads r from 0 to size in chunks, sleeping between them. On
// a read error it reads that chunk again block by block to name the first
// bad block.
func readPaced(ctx context.Context, r io.ReaderAt, size int64, p Pace, sleep func(context.Context, time.Duration) error) (*Verification, error) {
	v := &Verification{BadBlock: -1}
	start := time.Now()
	defer func() { v.Took = time.Since(start) }()
	if err := sleep(ctx, p.Delay); err != nil {
		return v, err
	}
	buf, free, err := alignedBuffer(p.Chunk)
	if err != nil {
		return v, err
	}
	defer free()
	for off := int64(0); off < size; {
		n := int64(len(buf))
		if size-off < n {
			n = size - off
		}
		t := time.Now()
		got, err := r.ReadAt(buf[:n], off)
		d := time.Since(t)
		v.Busy += d
		if err != nil && !(errors.Is(err, io.EOF) && int64(got) == n) {
			bad := firstBadBlock(r, buf, off, n)
			v.BadBlock = bad / verity.BlockSize
			return v, fmt.Errorf("%w: reading block %d (byte %d): %v", ErrTampered, v.BadBlock, bad, err)
		}
		off += n
		v.Bytes = off
		if err := sleep(ctx, time.Duration(float64(d)*(1-p.Busy)/p.Busy)); err != nil {
			return v, err
		}
	}
	return v, nil
}

// firstBadBlock returns the offset of the first block in [off, off+n)
// that fails to read (off itself if each reads fine on its own now).
func firstBadBlock(r io.ReaderAt, buf []byte, off, n int64) int64 {
	for b := off; b < off+n; b += verity.BlockSize {
		if _, err := r.ReadAt(buf[:verity.BlockSize], b); err != nil && !errors.Is(err, io.EOF) {
			return b
		}
	}
	return off
}

func sleepCtx(ctx context.Context, d time.Duration) error {
	if d <= 0 {
		return ctx.Err()
	}
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-t.C:
		return nil
	}
}

// alignedBuffer returns page-aligned memory, as O_DIRECT needs.
func alignedBuffer(n int) ([]byte, func(), error) {
	b, err := unix.Mmap(-1, 0, n, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_PRIVATE|unix.MAP_ANONYMOUS)
	if err != nil {
		return nil, nil, err
	}
	return b, func() { unix.Munmap(b) }, nil
}

// ioprioSetIdle puts thread tid into the idle I/O class (ioprio_set(2);
// x/sys/unix has no wrapper). Failure only costs priority.
func ioprioSetIdle(tid int) {
	const (
		whoProcess = 1
		classIdle  = 3
		classShift = 13
	)
	unix.Syscall(unix.SYS_IOPRIO_SET, whoProcess, uintptr(tid), classIdle<<classShift)
}
