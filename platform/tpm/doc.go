// Package tpm seals secrets (the data-disk key) to the node's TPM 2.0 under a
// PCR policy, and extends and reads PCRs.
//
// It speaks TPM commands itself through go-tpm's direct API, so /init stays a
// static CGO-free binary with no tpm2-tools or tpm2-abrmd on the node.
//
// # Sealing
//
// A TPM can only seal a few bytes, so every secret is put in an envelope: a
// fresh 32-byte key seals inside the TPM, the payload is AES-256-GCM
// encrypted under that key outside it.
//
//	Seal / SealTo                              Unseal
//	─────────────                              ──────
//	key = rand(32)                             parse blob (ErrCorruptBlob)
//	policy = PolicyPCR(pcrs, values)           SRK = CreatePrimary(owner, ECC P-256)
//	SRK = CreatePrimary(owner, ECC P-256)      SRK name ≠ blob's? → ErrWrongTPM
//	Create(SRK, keyedhash{key},                Load(SRK, pub, priv)
//	       authPolicy = policy)                policy session (salted to SRK)
//	   └─► pub, priv                             PolicyPCR(pcrs) ─ TPM hashes the
//	AES-GCM(key, payload, AAD = header)             current PCR values
//	                                            Unseal ─► key  (policy fail →
//	                                                            PCRMismatchError)
//	                                            AES-GCM open ─► payload
//
// # Blob format (version 1, big-endian)
//
//	┌──────────────────────────── header = GCM AAD ───────────────────────────┐
//	│ "PLTPMSL1" │ u16 version │ u16 hash alg │ u8 n │ n × (u8 pcr, [32] value) │
//	│ u16+SRK name │ u16+TPM2B_PUBLIC body │ u16+TPM2B_PRIVATE body             │
//	└─────────────────────────────────────────────────────────────────────────┘
//	│ [12] GCM nonce │ ciphertext ‖ 16-byte tag (rest of the blob)            │
//
// The PCR values in the header are what the sealed object's policy was
// computed from; Unseal recomputes that policy and refuses a blob whose
// header disagrees with its TPM object, so once the TPM has loaded the object
// the header values are trustworthy enough to explain a mismatch.
//
// # Boot-time use
//
// /init extends a PCR with the node parameters before unsealing and extends
// it again right after (see [TPM.Extend]), so nothing later in the same boot
// can unseal the key a second time. An upgrade reseals for the next image
// with [TPM.SealTo] and PCR values predicted by the image builder.
package tpm
