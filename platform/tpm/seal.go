package tpm

import (
	"bytes"
	"crypto/aes"
	"crypto/cipher"
	"crypto/rand"
	"crypto/sha256"
	"encoding/binary"
	"errors"
	"fmt"
	"maps"
	"slices"
	"strings"

	"github.com/google/go-tpm/tpm2"
)

// ErrWrongTPM means the blob was sealed by another TPM, or this TPM's owner
// hierarchy was cleared since: its storage root key is not the one the blob
// was sealed under, so the TPM cannot load it. Errors wrap it.
var ErrWrongTPM = errors.New("tpm: blob was sealed by a different TPM (or this TPM was cleared)")

// PCRMismatchError is returned by Unseal when the TPM refuses because PCRs
// no longer hold the values the blob was sealed to.
type PCRMismatchError struct {
	PCRs []int // ascending
}

func (e *PCRMismatchError) Error() string {
	s := make([]string, len(e.PCRs))
	for i, p := range e.PCRs {
		s[i] = fmt.Sprint(p)
	}
	if len(s) == 1 {
		return "TPM refused to unseal: PCR " + s[0] + " differs from the value sealed to"
	}
	return "TPM refused to unseal: PCRs " + strings.Join(s, ", ") + " differ from the values sealed to"
}

const keySize = 32 // AES-256

// srkTemplate is the TCG reference ECC P-256 SRK. The SRK is never stored:
// CreatePrimary derives the same key from the owner seed and this template
// on every boot, so changing a single bit of it orphans every sealed blob.
// TestSRKTemplatePinned guards against a go-tpm upgrade doing that.
var srkTemplate = tpm2.ECCSRKTemplate

// sealedTemplate is the sealed-data object. No userWithAuth: the only way to
// use it is a policy session satisfying authPolicy. NoDA because failed
// policy checks are expected (after an upgrade, in the wrong boot phase)
// and must never push the TPM towards dictionary-attack lockout.
func sealedTemplate(policy []byte) tpm2.TPMTPublic {
	return tpm2.TPMTPublic{
		Type:    tpm2.TPMAlgKeyedHash,
		NameAlg: tpm2.TPMAlgSHA256,
		ObjectAttributes: tpm2.TPMAObject{
			FixedTPM:    true,
			FixedParent: true,
			NoDA:        true,
		},
		AuthPolicy: tpm2.TPM2BDigest{Buffer: policy},
		Parameters: tpm2.NewTPMUPublicParms(tpm2.TPMAlgKeyedHash,
			&tpm2.TPMSKeyedHashParms{
				Scheme: tpm2.TPMTKeyedHashScheme{Scheme: tpm2.TPMAlgNull},
			}),
	}
}

// policyPCR computes, without a TPM, the digest a policy session has after a
// single TPM2_PolicyPCR over pcrs (TPM 2.0 Part 3, 23.7):
//
//	pcrDigest    = SHA256(value_1 ‖ … ‖ value_n)   (ascending PCR order)
//	policyDigest = SHA256(0³² ‖ TPM_CC_PolicyPCR ‖ TPML_PCR_SELECTION ‖ pcrDigest)
//
// Doing this in software is what lets SealTo target PCR values that do not
// exist yet (the next image's).
func policyPCR(pcrs []sealedPCR) []byte {
	idx := make([]int, len(pcrs))
	values := sha256.New()
	for i, p := range pcrs {
		idx[i] = p.index
		values.Write(p.value)
	}
	h := sha256.New()
	h.Write(make([]byte, sha256.Size))
	h.Write(binary.BigEndian.AppendUint32(nil, uint32(tpm2.TPMCCPolicyPCR)))
	h.Write(tpm2.Marshal(pcrSelection(idx)))
	h.Write(values.Sum(nil))
	return h.Sum(nil)
}

// Seal seals secret to the current SHA-256 values of pcrs.
func (t *TPM) Seal(secret []byte, pcrs []int) ([]byte, error) {
	sorted, err := normalisePCRs(pcrs)
	if err != nil {
		return nil, err
	}
	if len(sorted) == 0 {
		return nil, errors.New("tpm: seal: no PCRs given (that would let anyone with the TPM unseal)")
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	values, err := t.readPCRs(sorted)
	if err != nil {
		return nil, err
	}
	return t.seal(secret, values)
}

// SealTo seals secret to the given SHA-256 PCR values, which need not be the
// current ones: an upgrade seals to the values the next image will produce.
func (t *TPM) SealTo(secret []byte, expected map[int][]byte) ([]byte, error) {
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.seal(secret, expected)
}

func (t *TPM) seal(secret []byte, expected map[int][]byte) ([]byte, error) {
	if len(expected) == 0 {
		return nil, errors.New("tpm: seal: no PCRs given (that would let anyone with the TPM unseal)")
	}
	var pcrs []sealedPCR
	for _, idx := range slices.Sorted(maps.Keys(expected)) {
		v := expected[idx]
		if idx < 0 || idx >= numPCRs {
			return nil, fmt.Errorf("tpm: seal: PCR %d out of range 0..%d", idx, numPCRs-1)
		}
		if len(v) != sha256.Size {
			return nil, fmt.Errorf("tpm: seal: PCR %d value is %d bytes, want a SHA-256 digest", idx, len(v))
		}
		pcrs = append(pcrs, sealedPCR{idx, slices.Clone(v)})
	}

	key, err := t.newKey()
	if err != nil {
		return nil, err
	}
	defer clear(key)

	srk, err := t.createSRK()
	if err != nil {
		return nil, err
	}
	defer t.flush(srk.handle)

	created, err := tpm2.Create{
		ParentHandle: tpm2.AuthHandle{
			Handle: srk.handle,
			Name:   srk.name,
			// The key travels to the TPM in InSensitive: encrypt it with a
			// session salted to the SRK so a bus sniffer cannot read it.
			Auth: tpm2.HMAC(tpm2.TPMAlgSHA256, 16,
				tpm2.Salted(srk.handle, srk.public),
				tpm2.AESEncryption(128, tpm2.EncryptIn)),
		},
		InSensitive: tpm2.TPM2BSensitiveCreate{Sensitive: &tpm2.TPMSSensitiveCreate{
			Data: tpm2.NewTPMUSensitiveCreate(&tpm2.TPM2BSensitiveData{Buffer: key}),
		}},
		InPublic: tpm2.New2B(sealedTemplate(policyPCR(pcrs))),
	}.Execute(t.t)
	if err != nil {
		return nil, fmt.Errorf("tpm: seal: Create: %w", err)
	}

	header, err := marshalHeader(pcrs, srk.name.Buffer, created.OutPublic.Bytes(), created.OutPrivate.Buffer)
	if err != nil {
		return nil, err
	}
	aead, err := newGCM(key)
	if err != nil {
		return nil, err
	}
	nonce := make([]byte, gcmNonceSize)
	if _, err := rand.Read(nonce); err != nil {
		return nil, err
	}
	// A fresh buffer, so the ciphertext is never written over the memory
	// that holds the AAD.
	out := make([]byte, 0, len(header)+gcmNonceSize+len(secret)+gcmTagSize)
	out = append(append(out, header...), nonce...)
	return aead.Seal(out, nonce, secret, header), nil
}

// newKey mixes the kernel's RNG with the TPM's: /init seals very early in
// the first boot, and either source alone may be weaker than it claims.
func (t *TPM) newKey() ([]byte, error) {
	key := make([]byte, keySize)
	if _, err := rand.Read(key); err != nil {
		return nil, err
	}
	fromTPM, err := t.random(keySize)
	if err != nil {
		return nil, err
	}
	for i := range key {
		key[i] ^= fromTPM[i]
	}
	return key, nil
}

// Unseal returns the secret sealed in blob, if the PCRs hold the values it
// was sealed to. Errors: *PCRMismatchError, ErrWrongTPM, ErrCorruptBlob, or
// a TPM/transport failure.
func (t *TPM) Unseal(blob []byte) ([]byte, error) {
	b, err := parseBlob(blob)
	if err != nil {
		return nil, err
	}
	t.mu.Lock()
	defer t.mu.Unlock()

	srk, err := t.createSRK()
	if err != nil {
		return nil, err
	}
	defer t.flush(srk.handle)
	// The SRK name commits to the owner seed, so a different name is a
	// definite "other TPM" before Load gives its vaguer integrity error.
	if !bytes.Equal(srk.name.Buffer, b.srkName) {
		return nil, ErrWrongTPM
	}

	loaded, err := tpm2.Load{
		ParentHandle: tpm2.AuthHandle{
			Handle: srk.handle,
			Name:   srk.name,
			Auth:   tpm2.PasswordAuth(nil),
		},
		InPrivate: tpm2.TPM2BPrivate{Buffer: b.private},
		InPublic:  tpm2.BytesAs2B[tpm2.TPMTPublic](b.public),
	}.Execute(t.t)
	if err != nil {
		return nil, loadError(err)
	}
	defer t.flush(loaded.ObjectHandle)

	// Salting the policy session to the SRK and asking for response
	// encryption means the unsealed key crosses the bus AES-CFB encrypted
	// under a session key only we and the TPM know.
	sess, closeSess, err := tpm2.PolicySession(t.t, tpm2.TPMAlgSHA256, 16,
		tpm2.Salted(srk.handle, srk.public),
		tpm2.AESEncryption(128, tpm2.EncryptOut))
	if err != nil {
		return nil, fmt.Errorf("tpm: unseal: start policy session: %w", err)
	}
	defer closeSess()

	// No pcrDigest: the TPM hashes the PCRs' current values itself, and
	// the comparison with the sealed policy happens at Unseal.
	if _, err := (tpm2.PolicyPCR{
		PolicySession: sess.Handle(),
		Pcrs:          pcrSelection(b.pcrIndexes()),
	}).Execute(t.t); err != nil {
		return nil, fmt.Errorf("tpm: unseal: PolicyPCR: %w", err)
	}

	rsp, err := tpm2.Unseal{ItemHandle: tpm2.AuthHandle{
		Handle: loaded.ObjectHandle,
		Name:   loaded.Name,
		Auth:   sess,
	}}.Execute(t.t)
	if err != nil {
		if errors.Is(err, tpm2.TPMRCPolicyFail) {
			return nil, t.explainPolicyFailure(b, err)
		}
		return nil, fmt.Errorf("tpm: unseal: %w", err)
	}
	key := rsp.OutData.Buffer
	defer clear(key)
	if len(key) != keySize {
		return nil, corrupt("sealed key is %d bytes", len(key))
	}

	aead, err := newGCM(key)
	if err != nil {
		return nil, err
	}
	secret, err := aead.Open(nil, b.nonce, b.ciphertext, b.header)
	if err != nil {
		return nil, corrupt("payload does not authenticate")
	}
	return secret, nil
}

// explainPolicyFailure turns TPM_RC_POLICY_FAIL into the PCRs that moved.
// The header values are trustworthy here: parseBlob checked they produce the
// object's authPolicy, and Load checked the object.
func (t *TPM) explainPolicyFailure(b *blob, tpmErr error) error {
	current, err := t.readPCRs(b.pcrIndexes())
	if err != nil {
		return fmt.Errorf("tpm: unseal refused (%v), and reading PCRs failed: %w", tpmErr, err)
	}
	var differ []int
	for _, p := range b.pcrs {
		if !bytes.Equal(current[p.index], p.value) {
			differ = append(differ, p.index)
		}
	}
	if len(differ) == 0 {
		return fmt.Errorf("tpm: unseal refused although PCRs %v match the sealed values: %w", b.pcrIndexes(), tpmErr)
	}
	return &PCRMismatchError{PCRs: differ}
}

// loadError classifies a Load failure. The SRK matched, so a TPM that
// rejects the object's integrity or structure means the blob was altered.
func loadError(err error) error {
	var fmt1 tpm2.TPMFmt1Error
	if errors.As(err, &fmt1) {
		if isParam, _ := fmt1.Parameter(); isParam {
			return fmt.Errorf("%w: TPM rejected the sealed object: %v", ErrCorruptBlob, err)
		}
	}
	return fmt.Errorf("tpm: unseal: Load: %w", err)
}

type srkHandle struct {
	handle tpm2.TPMHandle
	name   tpm2.TPM2BName
	public tpm2.TPMTPublic
}

// createSRK recreates the SRK instead of relying on a persistent handle:
// nothing needs provisioning, and a TPM reset or clear is detected rather
// than silently using some other key at the same handle.
func (t *TPM) createSRK() (*srkHandle, error) {
	rsp, err := tpm2.CreatePrimary{
		PrimaryHandle: tpm2.TPMRHOwner,
		InPublic:      tpm2.New2B(srkTemplate),
	}.Execute(t.t)
	if err != nil {
		return nil, fmt.Errorf("tpm: create SRK: %w", err)
	}
	pub, err := rsp.OutPublic.Contents()
	if err != nil {
		t.flush(rsp.ObjectHandle)
		return nil, fmt.Errorf("tpm: SRK public area: %w", err)
	}
	return &srkHandle{handle: rsp.ObjectHandle, name: rsp.Name, public: *pub}, nil
}

// flush frees a transient handle. On /dev/tpm0 nothing else would: the
// kernel resource manager only cleans up after /dev/tpmrm0 users, and a TPM
// has room for only a few transient objects.
func (t *TPM) flush(h tpm2.TPMHandle) {
	_, _ = tpm2.FlushContext{FlushHandle: h}.Execute(t.t)
}

func newGCM(key []byte) (cipher.AEAD, error) {
	block, err := aes.NewCipher(key)
	if err != nil {
		return nil, err
	}
	return cipher.NewGCM(block)
}
