package tpm

import (
	"bytes"
	"crypto/sha256"
	"encoding/binary"
	"errors"
	"fmt"

	"github.com/google/go-tpm/tpm2"
)

// ErrCorruptBlob means a sealed blob is malformed or was altered. Errors
// returned for such blobs wrap it.
var ErrCorruptBlob = errors.New("tpm: sealed blob is corrupt")

const (
	blobMagic   = "PLTPMSL1"
	blobVersion = 1
	// gcmNonceSize and gcmTagSize are the crypto/cipher GCM defaults.
	gcmNonceSize = 12
	gcmTagSize   = 16
)

// sealedPCR is one PCR of a blob's policy and the value it was sealed to.
type sealedPCR struct {
	index int
	value []byte // SHA-256
}

// blob is a parsed sealed blob. public and private are the bodies of the
// TPM2B_PUBLIC and TPM2B_PRIVATE (without the TPM's own size prefix).
type blob struct {
	pcrs       []sealedPCR // ascending, unique
	srkName    []byte
	public     []byte
	private    []byte
	header     []byte // the bytes authenticated as GCM additional data
	nonce      []byte
	ciphertext []byte
}

func (b *blob) pcrIndexes() []int {
	out := make([]int, len(b.pcrs))
	for i, p := range b.pcrs {
		out[i] = p.index
	}
	return out
}

// marshalHeader encodes everything up to the GCM nonce; the result is both
// the start of the blob and the AAD, so rewriting any of it (e.g. the PCR
// values shown in mismatch errors) breaks decryption.
func marshalHeader(pcrs []sealedPCR, srkName, public, private []byte) ([]byte, error) {
	for _, f := range [][]byte{srkName, public, private} {
		if len(f) > 0xffff {
			return nil, fmt.Errorf("tpm: sealed blob field too large (%d bytes)", len(f))
		}
	}
	var buf bytes.Buffer
	buf.WriteString(blobMagic)
	be := binary.BigEndian
	buf.Write(be.AppendUint16(nil, blobVersion))
	buf.Write(be.AppendUint16(nil, uint16(tpm2.TPMAlgSHA256)))
	buf.WriteByte(byte(len(pcrs)))
	for _, p := range pcrs {
		buf.WriteByte(byte(p.index))
		buf.Write(p.value)
	}
	for _, f := range [][]byte{srkName, public, private} {
		buf.Write(be.AppendUint16(nil, uint16(len(f))))
		buf.Write(f)
	}
	return buf.Bytes(), nil
}

// reader is a bounds-checked cursor; after the first short read every
// further read fails too, so parse code can check once per field group.
type reader struct {
	b   []byte
	off int
	err error
}

func (r *reader) bytes(n int) []byte {
	if r.err != nil {
		return nil
	}
	if n < 0 || len(r.b)-r.off < n {
		r.err = fmt.Errorf("%w: truncated at byte %d", ErrCorruptBlob, r.off)
		return nil
	}
	out := r.b[r.off : r.off+n : r.off+n]
	r.off += n
	return out
}

func (r *reader) u8() int {
	b := r.bytes(1)
	if b == nil {
		return 0
	}
	return int(b[0])
}

func (r *reader) u16() int {
	b := r.bytes(2)
	if b == nil {
		return 0
	}
	return int(binary.BigEndian.Uint16(b))
}

func (r *reader) sized() []byte { return r.bytes(r.u16()) }

func corrupt(format string, args ...any) error {
	return fmt.Errorf("%w: "+format, append([]any{ErrCorruptBlob}, args...)...)
}

// parseBlob decodes a blob and checks that it is self-consistent: that the
// sealed object is a policy-only keyed-hash object whose policy is exactly
// PolicyPCR over the header's PCR values. It needs no TPM and never panics.
func parseBlob(data []byte) (*blob, error) {
	r := &reader{b: data}
	if magic := r.bytes(len(blobMagic)); r.err != nil || string(magic) != blobMagic {
		return nil, corrupt("not a sealed blob (bad magic)")
	}
	if v := r.u16(); r.err == nil && v != blobVersion {
		return nil, corrupt("unsupported version %d", v)
	}
	if alg := r.u16(); r.err == nil && alg != int(tpm2.TPMAlgSHA256) {
		return nil, corrupt("unsupported PCR bank 0x%04x", alg)
	}
	n := r.u8()
	if r.err == nil && n == 0 {
		return nil, corrupt("no PCRs")
	}
	b := &blob{}
	for i := 0; i < n && r.err == nil; i++ {
		idx := r.u8()
		val := r.bytes(sha256.Size)
		if r.err != nil {
			break
		}
		if idx >= numPCRs {
			return nil, corrupt("PCR %d out of range", idx)
		}
		if i > 0 && idx <= b.pcrs[i-1].index {
			return nil, corrupt("PCR list not ascending")
		}
		b.pcrs = append(b.pcrs, sealedPCR{idx, val})
	}
	b.srkName = r.sized()
	b.public = r.sized()
	b.private = r.sized()
	b.header = data[:r.off:r.off]
	b.nonce = r.bytes(gcmNonceSize)
	if r.err != nil {
		return nil, r.err
	}
	b.ciphertext = data[r.off:]
	if len(b.ciphertext) < gcmTagSize {
		return nil, corrupt("ciphertext shorter than the GCM tag")
	}
	if len(b.private) == 0 || len(b.srkName) == 0 {
		return nil, corrupt("empty TPM object")
	}
	if err := checkSealedPublic(b.public, policyPCR(b.pcrs)); err != nil {
		return nil, err
	}
	return b, nil
}

// checkSealedPublic makes sure the TPM object really is guarded by the
// header's policy. The TPM only checks the public area against the private
// one, not against our header; without this a blob could claim one PCR set
// in its header and be sealed to another, and mismatch errors would lie.
func checkSealedPublic(public, wantPolicy []byte) (err error) {
	defer func() {
		// go-tpm's reflective unmarshaller is not written for hostile input.
		if p := recover(); p != nil {
			err = corrupt("TPM public area: %v", p)
		}
	}()
	pub, err := tpm2.Unmarshal[tpm2.TPMTPublic](public)
	if err != nil {
		return corrupt("TPM public area: %v", err)
	}
	// Trailing garbage would be ignored by Unmarshal but rejected by the
	// TPM with an unhelpful size error.
	if !bytes.Equal(tpm2.Marshal(*pub), public) {
		return corrupt("TPM public area is not canonical")
	}
	switch {
	case pub.Type != tpm2.TPMAlgKeyedHash || pub.NameAlg != tpm2.TPMAlgSHA256:
		return corrupt("TPM object is not a SHA-256 keyed-hash object")
	case pub.ObjectAttributes.UserWithAuth || !pub.ObjectAttributes.FixedTPM:
		return corrupt("TPM object is not policy-only and fixed to the TPM")
	case !bytes.Equal(pub.AuthPolicy.Buffer, wantPolicy):
		return corrupt("TPM object policy does not match the PCRs in the header")
	}
	return nil
}
