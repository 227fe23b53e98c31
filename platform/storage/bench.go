package storage

import (
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"os"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"

	"plinth.dev/plinth/platform/blockdev"
	"plinth.dev/plinth/platform/devicemapper"
)

// Throughput of one device.
type Throughput struct {
	WriteMBps, ReadMBps float64
}

// CryptBenchmark compares a raw disk with dm-crypt over it.
type CryptBenchmark struct {
	Raw, Crypt Throughput
	Bytes      int64
}

// BenchmarkCrypt measures sequential O_DIRECT writes and reads of n bytes
// on scratch, raw and then through the same dm-crypt mapping the data disk
// uses (AES-256-XTS, 4 KiB sectors, random key). It destroys scratch's
// contents: only ever pass a disk that exists for benchmarking.
func BenchmarkCrypt(scratch string, n int64) (*CryptBenchmark, error) {
	res := &CryptBenchmark{Bytes: n}
	var err error
	if res.Raw, err = measure(scratch, n); err != nil {
		return nil, err
	}
	key := make([]byte, 64)
	rand.Read(key)
	dev, err := blockdev.MajorMinor(scratch)
	if err != nil {
		return nil, err
	}
	const name = "bench-crypt"
	t := []devicemapper.Target{{Length: uint64(n / 512), Type: "crypt",
		Params: fmt.Sprintf("aes-xts-plain64 %s 0 %s 0 1 sector_size:4096", hex.EncodeToString(key), dev)}}
	if err := activate(name, t); err != nil {
		return nil, err
	}
	defer devicemapper.Remove(name)
	if res.Crypt, err = measure("/dev/mapper/"+name, n); err != nil {
		return nil, err
	}
	return res, nil
}

func measure(dev string, n int64) (Throughput, error) {
	const chunk = 1 << 20
	raw := make([]byte, chunk+4096)
	// O_DIRECT needs a buffer aligned to the logical block size.
	off := int(4096 - uintptr(unsafe.Pointer(&raw[0]))%4096)
	buf := raw[off : off+chunk]
	rand.Read(buf)
	f, err := os.OpenFile(dev, os.O_RDWR|unix.O_DIRECT, 0)
	if err != nil {
		return Throughput{}, err
	}
	defer f.Close()
	var tp Throughput
	t := time.Now()
	for done := int64(0); done < n; done += chunk {
		if _, err := f.WriteAt(buf, done); err != nil {
			return tp, fmt.Errorf("writing %s: %w", dev, err)
		}
	}
	if err := f.Sync(); err != nil {
		return tp, err
	}
	tp.WriteMBps = float64(n) / (1 << 20) / time.Since(t).Seconds()
	t = time.Now()
	for done := int64(0); done < n; done += chunk {
		if _, err := f.ReadAt(buf, done); err != nil {
			return tp, fmt.Errorf("reading %s: %w", dev, err)
		}
	}
	tp.ReadMBps = float64(n) / (1 << 20) / time.Since(t).Seconds()
	return tp, nil
}
