package tpm

import (
	"crypto/sha256"
	"errors"
	"fmt"
	"io/fs"
	"slices"
	"sync"

	"github.com/google/go-tpm/tpm2"
	"github.com/google/go-tpm/tpm2/transport"
	"github.com/google/go-tpm/tpm2/transport/linuxtpm"
)

// ErrNoTPM means the node has no TPM character device at all, as opposed to
// one that exists but cannot be opened.
var ErrNoTPM = errors.New("tpm: no TPM device (/dev/tpmrm0 or /dev/tpm0)")

// numPCRs is the PC Client minimum PCR count; larger indexes are refused
// rather than guessed at, because the selection bitmap sizes depend on it.
const numPCRs = 24

// devices are tried in order: the kernel resource manager first, because it
// flushes whatever a crashed user left behind and lets other processes
// share the TPM; the raw device is the fallback for kernels without it.
var devices = []string{"/dev/tpmrm0", "/dev/tpm0"}

// TPM is a connection to a TPM 2.0. Its methods are safe for concurrent use:
// they are serialised because sealing and unsealing are multi-command
// sequences on shared transient handles.
type TPM struct {
	mu   sync.Mutex
	t    transport.TPMCloser
	name string
}

// Open opens the node's TPM, /dev/tpmrm0 or else /dev/tpm0. It returns an
// error wrapping ErrNoTPM when neither device exists.
func Open() (*TPM, error) {
	var errs []error
	for _, dev := range devices {
		t, err := linuxtpm.Open(dev)
		if err == nil {
			return New(t, dev), nil
		}
		if errors.Is(err, fs.ErrNotExist) {
			continue
		}
		// The device exists but is unusable (busy /dev/tpm0, permissions,
		// not a device): that is not "no TPM", and must not be reported as
		// such, or a caller could fall back to an unencrypted mode.
		errs = append(errs, fmt.Errorf("tpm: open %s: %w", dev, err))
	}
	if len(errs) > 0 {
		return nil, errors.Join(errs...)
	}
	return nil, ErrNoTPM
}

// New wraps an already open transport, e.g. a simulator or a swtpm socket.
// name is what Name reports.
func New(t transport.TPMCloser, name string) *TPM {
	return &TPM{t: t, name: name}
}

// Close closes the transport.
func (t *TPM) Close() error {
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.t.Close()
}

// Name is the device path, or the name given to New.
func (t *TPM) Name() string { return t.name }

// Random returns n bytes from the TPM's RNG.
func (t *TPM) Random(n int) ([]byte, error) {
	if n < 0 {
		return nil, fmt.Errorf("tpm: random: negative length %d", n)
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.random(n)
}

func (t *TPM) random(n int) ([]byte, error) {
	out := make([]byte, 0, n)
	for len(out) < n {
		// A TPM returns at most one digest's worth (32 or 48 bytes) per
		// call, whatever is asked for.
		want := min(n-len(out), 0xffff)
		rsp, err := tpm2.GetRandom{BytesRequested: uint16(want)}.Execute(t.t)
		if err != nil {
			return nil, fmt.Errorf("tpm: GetRandom: %w", err)
		}
		got := rsp.RandomBytes.Buffer
		if len(got) == 0 {
			return nil, errors.New("tpm: GetRandom returned no bytes")
		}
		out = append(out, got[:min(len(got), want)]...)
	}
	return out, nil
}

// ReadPCRs reads the SHA-256 bank.
func (t *TPM) ReadPCRs(pcrs []int) (map[int][]byte, error) {
	sorted, err := normalisePCRs(pcrs)
	if err != nil {
		return nil, err
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.readPCRs(sorted)
}

// readPCRs takes a sorted, deduplicated list.
func (t *TPM) readPCRs(pcrs []int) (map[int][]byte, error) {
	out := make(map[int][]byte, len(pcrs))
	remaining := slices.Clone(pcrs)
	// A TPM answers at most 8 digests per PCR_Read and says which ones in
	// pcrSelectionOut, so ask again for the rest until nothing is left.
	for len(remaining) > 0 {
		rsp, err := tpm2.PCRRead{PCRSelectionIn: pcrSelection(remaining)}.Execute(t.t)
		if err != nil {
			return nil, fmt.Errorf("tpm: PCR_Read: %w", err)
		}
		got := selectedPCRs(rsp.PCRSelectionOut)
		if len(got) == 0 {
			return nil, fmt.Errorf("tpm: PCR_Read returned nothing for PCRs %v (is the SHA-256 bank allocated?)", remaining)
		}
		if len(got) != len(rsp.PCRValues.Digests) {
			return nil, fmt.Errorf("tpm: PCR_Read returned %d values for %d PCRs", len(rsp.PCRValues.Digests), len(got))
		}
		for i, pcr := range got {
			j := slices.Index(remaining, pcr)
			v := rsp.PCRValues.Digests[i].Buffer
			if j < 0 || len(v) != sha256.Size {
				return nil, fmt.Errorf("tpm: PCR_Read returned an unexpected value for PCR %d", pcr)
			}
			out[pcr] = slices.Clone(v)
			remaining = slices.Delete(remaining, j, j+1)
		}
	}
	return out, nil
}

// Extend extends PCR pcr of the SHA-256 bank with sha256(data). Only that
// bank is touched: it is the one every policy of this package uses.
func (t *TPM) Extend(pcr int, data []byte) error {
	if pcr < 0 || pcr >= numPCRs {
		return fmt.Errorf("tpm: PCR %d out of range 0..%d", pcr, numPCRs-1)
	}
	digest := sha256.Sum256(data)
	t.mu.Lock()
	defer t.mu.Unlock()
	_, err := tpm2.PCRExtend{
		PCRHandle: tpm2.AuthHandle{
			Handle: tpm2.TPMHandle(pcr),
			Auth:   tpm2.PasswordAuth(nil),
		},
		Digests: tpm2.TPMLDigestValues{Digests: []tpm2.TPMTHA{{
			HashAlg: tpm2.TPMAlgSHA256,
			Digest:  digest[:],
		}}},
	}.Execute(t.t)
	if err != nil {
		return fmt.Errorf("tpm: extend PCR %d: %w", pcr, err)
	}
	return nil
}

// normalisePCRs validates, sorts and deduplicates a PCR list. Ascending order
// matters: it is the order in which the TPM concatenates PCR values for
// PolicyPCR, so software-computed policies depend on it.
func normalisePCRs(pcrs []int) ([]int, error) {
	out := slices.Clone(pcrs)
	for _, p := range out {
		if p < 0 || p >= numPCRs {
			return nil, fmt.Errorf("tpm: PCR %d out of range 0..%d", p, numPCRs-1)
		}
	}
	slices.Sort(out)
	return slices.Compact(out), nil
}

// pcrSelection is the SHA-256-bank selection of the given PCRs.
func pcrSelection(pcrs []int) tpm2.TPMLPCRSelection {
	u := make([]uint, len(pcrs))
	for i, p := range pcrs {
		u[i] = uint(p)
	}
	return tpm2.TPMLPCRSelection{PCRSelections: []tpm2.TPMSPCRSelection{{
		Hash:      tpm2.TPMAlgSHA256,
		PCRSelect: tpm2.PCClientCompatible.PCRs(u...),
	}}}
}

// selectedPCRs lists, in ascending order, the SHA-256 PCRs a selection
// names; the TPM returns values in this order.
func selectedPCRs(sel tpm2.TPMLPCRSelection) []int {
	var out []int
	for _, s := range sel.PCRSelections {
		if s.Hash != tpm2.TPMAlgSHA256 {
			continue
		}
		for i, b := range s.PCRSelect {
			for bit := range 8 {
				if b&(1<<bit) != 0 {
					out = append(out, i*8+bit)
				}
			}
		}
	}
	return out
}
