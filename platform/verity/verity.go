// Package verity computes dm-verity hash trees and describes verity devices.
//
// The builder appends the hash tree to the system image and puts Params on
// the kernel command line; the node parses them back and hands the kernel
// a dm-verity table, so every block read from the image is checked against
// a root hash that was measured with the kernel command line.
//
//	image file:  [ data blocks 0..N-1 ][ hash tree: top level first ... level 0 ]
//	                                     ^ HashStartBlock
//	root hash = sha256(salt || top-level hash block)
//
// The layout is the kernel's (drivers/md/dm-verity-target.c, format
// version 1): a hash block holds 4096/32 = 128 digests, each digest is
// sha256(salt || block), levels are stored from the top down, and unused
// space in a hash block is zero.
package verity

import (
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"strconv"
	"strings"
)

// BlockSize is used for both data and hash blocks.
const BlockSize = 4096

const digestSize = sha256.Size
const perBlock = BlockSize / digestSize

// Params identify a verity-protected image.
type Params struct {
	DataBlocks     uint64
	HashStartBlock uint64 // in BlockSize units, on the same device as the data
	Salt           []byte
	RootHash       []byte
}

// String is the kernel command line value: "v1,sha256,4096,BLOCKS,HASHSTART,SALT,ROOT".
func (p Params) String() string {
	return fmt.Sprintf("v1,sha256,%d,%d,%d,%s,%s", BlockSize, p.DataBlocks, p.HashStartBlock,
		hex.EncodeToString(p.Salt), hex.EncodeToString(p.RootHash))
}

// ParseParams reverses String.
func ParseParams(s string) (Params, error) {
	f := strings.Split(s, ",")
	if len(f) != 7 || f[0] != "v1" || f[1] != "sha256" || f[2] != strconv.Itoa(BlockSize) {
		return Params{}, fmt.Errorf("verity parameters %q: want v1,sha256,4096,BLOCKS,HASHSTART,SALT,ROOTHASH", s)
	}
	var p Params
	var err error
	if p.DataBlocks, err = strconv.ParseUint(f[3], 10, 64); err != nil || p.DataBlocks == 0 {
		return Params{}, fmt.Errorf("verity parameters: bad data block count %q", f[3])
	}
	if p.HashStartBlock, err = strconv.ParseUint(f[4], 10, 64); err != nil || p.HashStartBlock < p.DataBlocks {
		return Params{}, fmt.Errorf("verity parameters: bad hash start %q", f[4])
	}
	if p.Salt, err = hex.DecodeString(f[5]); err != nil {
		return Params{}, fmt.Errorf("verity parameters: bad salt: %w", err)
	}
	if p.RootHash, err = hex.DecodeString(f[6]); err != nil || len(p.RootHash) != digestSize {
		return Params{}, fmt.Errorf("verity parameters: root hash must be %d hex-encoded bytes", digestSize)
	}
	return p, nil
}

// Table is the device-mapper table line for a verity target whose data and
// hash tree are both on dev (a path or major:minor).
func (p Params) Table(dev string) string {
	salt := hex.EncodeToString(p.Salt)
	if salt == "" {
		salt = "-"
	}
	return fmt.Sprintf("0 %d verity 1 %s %s %d %d %d %d sha256 %s %s",
		p.DataBlocks*BlockSize/512, dev, dev, BlockSize, BlockSize, p.DataBlocks, p.HashStartBlock,
		hex.EncodeToString(p.RootHash), salt)
}

// levelSizes returns the number of hash blocks per level, level 0 first
// (the level that hashes data blocks).
func levelSizes(dataBlocks uint64) []uint64 {
	var sizes []uint64
	n := dataBlocks
	for n > 1 || len(sizes) == 0 {
		n = (n + perBlock - 1) / perBlock
		sizes = append(sizes, n)
		if n == 1 {
			break
		}
	}
	return sizes
}

// HashBlocks is the size of the hash tree in blocks.
func (p Params) HashBlocks() uint64 {
	var n uint64
	for _, s := range levelSizes(p.DataBlocks) {
		n += s
	}
	return n
}

// AppendTree reads the data blocks of f (its size must be a multiple of
// BlockSize), writes the hash tree right after them and returns the params.
func AppendTree(f interface {
	io.ReaderAt
	io.WriterAt
}, dataSize int64, salt []byte) (Params, error) {
	if dataSize <= 0 || dataSize%BlockSize != 0 {
		return Params{}, fmt.Errorf("verity: data size %d is not a positive multiple of %d", dataSize, BlockSize)
	}
	dataBlocks := uint64(dataSize / BlockSize)
	if dataBlocks < 2 {
		// The kernel uses no hash tree at all for one block; images never are that small.
		return Params{}, errors.New("verity: image must have at least two blocks")
	}
	sizes := levelSizes(dataBlocks)
	// Levels are stored top first; compute each level's offset in blocks.
	offsets := make([]uint64, len(sizes))
	pos := dataBlocks
	for i := len(sizes) - 1; i >= 0; i-- {
		offsets[i] = pos
		pos += sizes[i]
	}

	hashBlock := func(b []byte) []byte {
		h := sha256.New()
		h.Write(salt)
		h.Write(b)
		return h.Sum(nil)
	}
	// Hash one level: read `count` blocks starting at `from`, write the
	// digests packed into hash blocks starting at `to`.
	buf := make([]byte, BlockSize)
	out := make([]byte, BlockSize)
	hashLevel := func(from, count, to uint64) error {
		var filled int
		var written uint64
		flush := func() error {
			clear(out[filled:])
			if _, err := f.WriteAt(out, int64((to+written)*BlockSize)); err != nil {
				return err
			}
			written++
			filled = 0
			return nil
		}
		for i := uint64(0); i < count; i++ {
			if _, err := f.ReadAt(buf, int64((from+i)*BlockSize)); err != nil {
				return fmt.Errorf("verity: reading block %d: %w", from+i, err)
			}
			copy(out[filled:], hashBlock(buf))
			filled += digestSize
			if filled == BlockSize {
				if err := flush(); err != nil {
					return err
				}
			}
		}
		if filled > 0 {
			return flush()
		}
		return nil
	}

	from, count := uint64(0), dataBlocks
	for i := range sizes {
		if err := hashLevel(from, count, offsets[i]); err != nil {
			return Params{}, err
		}
		from, count = offsets[i], sizes[i]
	}
	top := make([]byte, BlockSize)
	if _, err := f.ReadAt(top, int64(offsets[len(offsets)-1]*BlockSize)); err != nil {
		return Params{}, err
	}
	return Params{DataBlocks: dataBlocks, HashStartBlock: dataBlocks, Salt: salt, RootHash: hashBlock(top)}, nil
}

// HoldsTree reports whether r (a device or file laid out as the builder
// writes an image) has, at p's HashStartBlock, a top-level hash block
// whose digest is p's root hash: then it holds p's image, or at least its
// hash tree, which a dm-verity read-through confirms or refutes. One
// block is read.
func HoldsTree(r io.ReaderAt, p Params) bool {
	block := make([]byte, BlockSize)
	if _, err := r.ReadAt(block, int64(p.HashStartBlock)*BlockSize); err != nil {
		return false
	}
	h := sha256.New()
	h.Write(p.Salt)
	h.Write(block)
	return string(h.Sum(nil)) == string(p.RootHash)
}
