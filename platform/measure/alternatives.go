package measure

import (
	"encoding/binary"
	"errors"
	"fmt"
	"strings"
)

// A sealed key that opens with either of two PCR sets: while an A/B update
// is pending, the node's keys are sealed to the running slot's boot and to
// the new slot's predicted one, each set in its own TPM object, and the
// header holds them together:
//
//	"PLALTSL1" | u8 n | n × (u32 LE length | sealed blob)
//
// A plain sealed blob (one set) is kept as it always was, so nodes that
// never updated keep their headers byte for byte. Why not one object with
// PolicyOR: the objects stay independent (dropping a set is writing one
// blob back), and each keeps its own mismatch report.
const altMagic = "PLALTSL1"

// maxAlternatives bounds a blob (two during an update; a spare).
const maxAlternatives = 3

func marshalAlternatives(blobs [][]byte) []byte {
	b := append([]byte(altMagic), byte(len(blobs)))
	for _, x := range blobs {
		b = binary.LittleEndian.AppendUint32(b, uint32(len(x)))
		b = append(b, x...)
	}
	return b
}

// errCorruptAlternatives: the blob starts like alternatives and is not.
var errCorruptAlternatives = errors.New("measure: corrupt blob of alternative seals")

// splitAlternatives returns the sealed blobs b holds: itself for a plain
// blob.
func splitAlternatives(b []byte) ([][]byte, error) {
	rest, ok := strings.CutPrefix(string(b), altMagic)
	if !ok {
		return [][]byte{b}, nil
	}
	if len(rest) < 1 || rest[0] == 0 || int(rest[0]) > maxAlternatives {
		return nil, errCorruptAlternatives
	}
	n := int(rest[0])
	p := []byte(rest[1:])
	out := make([][]byte, 0, n)
	for range n {
		if len(p) < 4 {
			return nil, errCorruptAlternatives
		}
		l := binary.LittleEndian.Uint32(p)
		p = p[4:]
		if uint64(l) > uint64(len(p)) || l == 0 {
			return nil, errCorruptAlternatives
		}
		out = append(out, p[:l:l])
		p = p[l:]
	}
	if len(p) != 0 {
		return nil, errCorruptAlternatives
	}
	return out, nil
}

// Alternatives reports how many PCR sets blob opens with: 1 for a plain
// sealed blob, 2 while an update is pending; 0 if it is corrupt.
func Alternatives(blob []byte) int {
	bs, err := splitAlternatives(blob)
	if err != nil {
		return 0
	}
	return len(bs)
}

// unsealAny tries each alternative in turn.
func unsealAny(blob []byte, unseal func([]byte) ([]byte, error)) ([]byte, error) {
	bs, err := splitAlternatives(blob)
	if err != nil {
		return nil, err
	}
	var first error
	for i, b := range bs {
		secret, err := unseal(b)
		if err == nil {
			return secret, nil
		}
		if i == 0 {
			first = err
		} else {
			first = fmt.Errorf("%w; nor with the other PCR set (pending update): %v", first, err)
		}
	}
	return nil, first
}
