package uki

import (
	"cmp"
	"crypto/sha256"
	"encoding/binary"
	"fmt"
	"slices"
)

// AuthenticodeSHA256 returns the PE image's Authenticode digest (what UEFI
// firmware measures into PCR 4 as EV_EFI_BOOT_SERVICES_APPLICATION, and what
// Secure Boot signs): the image hashed without the CheckSum field, without
// the Certificate Table data directory entry, sections in file order by
// PointerToRawData, then any trailing data after the last section minus the
// attribute certificate table (per Microsoft's "Windows Authenticode Portable
// Executable Signature Format").
//
// In detail, as the specification, EDK2's DxeImageVerificationLib and
// sbsigntool do it:
//
//  1. bytes [0, CheckSum), (CheckSum, Certificate Table entry) and
//     (Certificate Table entry, SizeOfHeaders), the two fields skipped;
//  2. the SizeOfRawData bytes at PointerToRawData of every section with
//     raw data, in order of PointerToRawData; SUM_OF_BYTES_HASHED is
//     SizeOfHeaders plus these sizes;
//  3. if the file is longer, the bytes from offset SUM_OF_BYTES_HASHED up
//     to the attribute certificate table (or the end of the file).
//
// For images whose sections follow each other without gaps, as [Build]
// writes them, step 3 is exactly the data after the last section. The
// certificate table, if any, must be at the end of the file.
func AuthenticodeSHA256(image []byte) ([]byte, error) {
	h, err := parse(image)
	if err != nil {
		return nil, fmt.Errorf("uki: %w", err)
	}
	hdrEnd := int(h.sizeOfHeaders)
	if h.checksumOff+4 > hdrEnd || h.certDirOff+8 > hdrEnd {
		return nil, fmt.Errorf("uki: SizeOfHeaders %#x does not cover the optional header", hdrEnd)
	}
	d := sha256.New()
	d.Write(image[:h.checksumOff])
	if h.certDirOff >= 0 {
		d.Write(image[h.checksumOff+4 : h.certDirOff])
		d.Write(image[h.certDirOff+8 : hdrEnd])
	} else {
		d.Write(image[h.checksumOff+4 : hdrEnd])
	}

	var secs []*rawSection
	for i := range h.sections {
		if h.sections[i].sizeOfRawData > 0 {
			secs = append(secs, &h.sections[i])
		}
	}
	slices.SortStableFunc(secs, func(a, b *rawSection) int {
		return cmp.Compare(a.pointerToRawData, b.pointerToRawData)
	})
	hashed := uint64(hdrEnd)
	for _, s := range secs {
		raw, err := rawRange(image, s)
		if err != nil {
			return nil, fmt.Errorf("uki: %w", err)
		}
		d.Write(raw)
		hashed += uint64(s.sizeOfRawData)
	}

	end := uint64(len(image))
	if h.certSize != 0 {
		if uint64(h.certOff)+uint64(h.certSize) != end {
			return nil, fmt.Errorf("uki: certificate table [%#x, +%#x) is not at the end of the file (%#x)",
				h.certOff, h.certSize, end)
		}
		end = uint64(h.certOff)
	}
	if end > hashed {
		d.Write(image[hashed:end])
	}
	return d.Sum(nil), nil
}

// Checksum computes the PE optional header CheckSum (the image with its
// CheckSum field taken as zero; 16-bit one's-complement-style carry sum over
// 16-bit words, plus file length), as Windows' CheckSumMappedFile does.
//
// A trailing odd byte counts as a word with high byte zero. If image has no
// recognisable PE header, no field is skipped.
func Checksum(image []byte) uint32 {
	var sum uint64
	n := len(image)
	i := 0
	for ; i+8 <= n; i += 8 {
		v := binary.LittleEndian.Uint64(image[i:])
		sum += v&0xffff + v>>16&0xffff + v>>32&0xffff + v>>48
	}
	for ; i+2 <= n; i += 2 {
		sum += uint64(binary.LittleEndian.Uint16(image[i:]))
	}
	if i < n {
		sum += uint64(image[i])
	}
	// Take the CheckSum field as zero: remove what its bytes added, each
	// as the low or high half of its word.
	if off := checksumOffset(image); off >= 0 {
		for p := off; p < off+4; p++ {
			sum -= uint64(image[p]) << (8 * (p & 1))
		}
	}
	// End-around carry: the same result as folding after every addition.
	for sum > 0xffff {
		sum = sum&0xffff + sum>>16
	}
	return uint32(sum) + uint32(n)
}
