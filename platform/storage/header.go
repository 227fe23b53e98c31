// Package storage holds the node's data disk: which disk it is
// (diskchoice.go: chosen once per boot, never by probe order), the Plinth
// data partition type and how the partition is found and checked
// (layout.go: by GPT entry number, against the kernel's device and the
// header's partition GUID), the header at the start of that partition,
// the checks that decide whether a disk is blank, the derivation of the
// volume key, and opening the volume (datadisk.go).
//
// # Layout
//
// As Plinth partitions a blank disk; on a flashed disk the data partition
// is one of several (ESP, system slots) and may follow empty entries.
//
//	data disk (GPT, see platform/gpt)
//	+------+-----+---------+-------------------------------------------+---------+-----+
//	| PMBR | GPT | entries | Plinth data partition (DataPartitionType) | entries | GPT |
//	+------+-----+---------+-------------------------------------------+---------+-----+
//	LBA 0    1     2..33     2048 (1 MiB) ...                            last-32   last
//
//	Plinth data partition
//	+----------------+----------------+-------------------------------------+
//	| slot 0  32 KiB | slot 1  32 KiB | dm-crypt area (dm-integrity below   |
//	| header copy    | header copy    | it in ModeAuthenticated) ...        |
//	+----------------+----------------+-------------------------------------+
//	0                SlotSize         HeaderSize = DataOffset = 64 KiB
//
//	one slot
//	+--------+---------+----------+------------------+---------+----------+
//	| magic  | version | body len | body (fields)    | SHA-256 | zeros    |
//	| 12 B   | 2 B     | 4 B      | body len bytes   | 32 B    | to 32KiB |
//	+--------+---------+----------+------------------+---------+----------+
//
// The header tells a node whether the partition was ever initialised,
// holds the TPM-sealed node unlock key, and records how the data area is
// encrypted. There is no LUKS: the volume key is derived (keys.go), so
// the header needs no key slots and never holds a key in the clear.
//
// # Why two slots
//
// Power can be cut in the middle of any write, and a disk may then hold
// any mix of old and new sectors of what it was writing. So no write may
// ever put the only copy of the header at risk. Each slot holds a complete
// header with its own checksum and a sequence number; odd sequence numbers
// live in slot 1, even ones in slot 0. WriteHeader writes the new header
// twice — first with sequence n+1 into the slot that does not hold n, the
// newest copy on disk, flushes, then with n+2 into the other, flushes —
// and ReadHeader uses the valid slot with the highest sequence number:
//
//   - cut during the first write: the other slot still holds the previous
//     header (even if an earlier cut left it the only valid copy);
//   - cut during the second write: the first already holds the new one;
//   - after a complete write both slots hold the same header, so later
//     damage to either slot (a bad sector, a bit flip) loses nothing: no
//     older state can resurface.
//
// The last point is what makes "StateInitialising" trustworthy: once a
// header says StateReady in both slots, no valid copy of StateInitialising
// remains anywhere, so a disk can never be mistaken for a half-initialised
// one and formatted again.
//
// # The very first write: the intent marker
//
// A region with no valid slot must still tell two cases apart that call
// for opposite actions: a first write cut short (setup never began; set it
// up, i.e. format) and a header that was damaged later (refuse; a person
// must look). Zeros cannot tell them apart — a cut first write and a
// zeroed or discarded slot 0 next to a damaged slot 1 look the same — so
// the first write leaves a mark before it writes any header byte:
//
//	WriteHeader on a blank region (h.Sequence == 0)
//	  1. slot 0, first sector: intent marker ("PLINTHINIT" magic, rest of
//	     the sector zero); flush
//	  2. slot 1: header, sequence 1; flush
//	  3. slot 0: header, sequence 2 (overwrites the marker); flush
//
//	slot 0                      slot 1            ReadHeader
//	─────────────────────────────────────────────────────────────────────
//	zero                        zero              ErrNoHeader (blank)
//	marker, rest of slot zero   not valid         ErrHeaderIncomplete
//	zero                        damaged/foreign   ErrCorruptHeader / ErrNotPlinth
//	anything                    valid             slot 1's header
//
// Cut before step 1 reached the disk: blank. Cut after it, anywhere in
// step 2: marker and a fragment (or nothing) in slot 1, so "setup never
// began", ErrHeaderIncomplete, which is also an ErrNoHeader. Cut in step 3:
// slot 1 is valid and complete. The marker is one sector, which a disk
// writes whole or not at all; it has no valid header next to it only
// until step 2 completes, and it is gone once step 3 completes. Damage
// after a complete first write can zero slot 0 but cannot write the
// marker's magic, so zero-and-damaged is refused. A marker with non-zero
// bytes after its sector (step 3 torn) is corrupt, not a marker; it only
// matters if slot 1 is damaged too, and then the region is refused.
//
// # First-time setup
//
// A caller initialises a blank partition in this order, so a cut at any
// point leaves a state the next boot recognises:
//
//  1. WriteHeader with StateInitialising (nothing else written yet);
//  2. set up dm-crypt / dm-integrity over the data area and run mkfs;
//  3. WriteHeader with StateReady.
//
// On boot: ErrNoHeader (including ErrHeaderIncomplete) or StateInitialising
// means setup never finished, so it is redone; StateReady means the data
// area is in use and is never formatted; ErrNotPlinth and ErrCorruptHeader
// are errors that need a person, and nothing is written.
package storage

import (
	"bytes"
	"crypto/sha256"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"math"

	"plinth.dev/plinth/platform/gpt"
)

// DataPartitionType is the GPT partition type of the Plinth data
// partition. It was generated once at random (a version 4 UUID) and must
// never change: nodes find their data partition by it.
var DataPartitionType = gpt.MustParseGUID(dataPartitionType)

const dataPartitionType = "B9067454-6B66-4704-A677-45E0D8925A0F"

const (
	// HeaderSize is the space the header takes at the start of the data
	// partition: two slots of SlotSize.
	HeaderSize = 64 << 10
	// SlotSize is the size of one header copy (what Encode returns).
	SlotSize = HeaderSize / 2
	// DataOffset is where the dm-crypt area starts, relative to the
	// partition start.
	DataOffset = HeaderSize
	// HeaderVersion is the only format version this code reads and writes.
	HeaderVersion = 1
)

// magic starts every slot. The trailing bytes keep it from matching text.
const magic = "PLINTHDATA\x00\x01"

// intentMagic starts the intent marker, which only the very first
// WriteHeader writes, into slot 0's first sector (see the package doc). It
// differs from magic in four bytes, and a marker is only a marker when the
// rest of slot 0 is zero, which no header slot ever is.
const intentMagic = "PLINTHINIT\x00\x01"

// intentSize is the marker's length: one sector, written whole or not at
// all.
const intentSize = 512

const (
	prefixLen   = len(magic) + 2 + 4 // magic, version, body length
	checksumLen = sha256.Size
	maxBody     = SlotSize - prefixLen - checksumLen
	maxPolicy   = 64
)

// State says how far first-time setup got.
type State uint8

const (
	// StateInitialising: setup has started and has not finished; the data
	// area holds nothing of value and setup is redone.
	StateInitialising State = 1
	// StateReady: the data area holds the node's filesystem.
	StateReady State = 2
)

func (s State) String() string {
	switch s {
	case StateInitialising:
		return "initialising"
	case StateReady:
		return "ready"
	}
	return fmt.Sprintf("State(%d)", uint8(s))
}

// Mode says how the data area is encrypted.
type Mode uint8

const (
	// ModeCrypt: dm-crypt with AES-256-XTS (confidentiality only).
	ModeCrypt Mode = 1
	// ModeAuthenticated: dm-crypt with AES-256-XTS and HMAC-SHA256 over
	// each sector, tags kept by dm-integrity (confidentiality and
	// integrity). See DeriveVolumeKey for the key layout.
	ModeAuthenticated Mode = 2
)

// String is also the mode's name in the key derivation, so it must never
// change.
func (m Mode) String() string {
	switch m {
	case ModeCrypt:
		return "crypt"
	case ModeAuthenticated:
		return "authenticated"
	}
	return fmt.Sprintf("Mode(%d)", uint8(m))
}

// Filesystems the header may name.
const (
	FilesystemExt4 = "ext4"
	FilesystemXFS  = "xfs"
)

// Key policies: how the node gets its node unlock key back and whether the
// cluster unlock key is mixed in. The header stores the string; this
// package does not interpret it beyond requiring printable ASCII.
const (
	KeyPolicyTPM           = "tpm"             // SealedKey is a TPM-sealed NUK
	KeyPolicyTPMAndCluster = "tpm+cluster"     // as above, and the CUK is mixed in
	KeyPolicyInsecureNoTPM = "insecure-no-tpm" // development only, by explicit cluster policy
)

// Header is the content of one header slot.
type Header struct {
	Version     uint16 // must be HeaderVersion
	State       State
	Mode        Mode
	Filesystem  string   // FilesystemExt4 or FilesystemXFS
	PartitionID gpt.GUID // the GPT unique GUID of the partition this header belongs to
	// SealedKey is an opaque blob (the TPM-sealed node unlock key); it may
	// be empty in no-TPM development mode.
	SealedKey []byte
	KeyPolicy string // e.g. KeyPolicyTPM; 1..64 printable ASCII characters
	Created   uint64 // unix seconds when setup started
	// Sequence orders the copies in the two slots. WriteHeader sets it;
	// pass back the header ReadHeader returned so it keeps increasing.
	Sequence uint64
	// Enrolment is an opaque blob the node keeps outside its encrypted
	// volume: on a node whose volume key needs the cluster unlock key it
	// holds the TPM-sealed join key and where to find the cluster, which
	// the node needs before it can open the volume. Empty otherwise.
	// Encoded after SealedKey so headers without it stay valid.
	Enrolment []byte
}

var (
	// ErrNoHeader: the region is all zero; the partition was never
	// initialised.
	ErrNoHeader = errors.New("storage: no header")
	// ErrNotPlinth: the region holds data that is not a Plinth header.
	// It must not be formatted.
	ErrNotPlinth = errors.New("storage: not a Plinth header")
	// ErrCorruptHeader: a Plinth header is there but damaged (checksum,
	// length or field errors). It must not be formatted.
	ErrCorruptHeader = errors.New("storage: corrupt header")
	// ErrUnsupportedVersion: a checksummed header of a format version this
	// code does not know, written by a newer Plinth. It is also an
	// ErrCorruptHeader, so callers that only know that one stay safe.
	ErrUnsupportedVersion = fmt.Errorf("%w: unsupported version", ErrCorruptHeader)
	// ErrHeaderIncomplete: slot 0 holds the intent marker and slot 1 no
	// valid header, which only a cut during the very first WriteHeader
	// leaves. It is also an ErrNoHeader: no header was ever committed. A
	// zero slot 0 next to a damaged slot 1 is not this but damage
	// (ErrCorruptHeader or ErrNotPlinth).
	ErrHeaderIncomplete = fmt.Errorf("%w: first header write was interrupted", ErrNoHeader)
	// errIntentMarker is a slot state (HeaderReport), never returned: slot 0
	// holds the intent marker.
	errIntentMarker = fmt.Errorf("%w: intent marker of an unfinished first write", ErrNoHeader)
	// ErrHeaderTooLarge: Encode cannot fit the header into a slot.
	ErrHeaderTooLarge = errors.New("storage: header does not fit in a slot")
)

// validate checks the field values; Encode and DecodeHeader share it so
// that everything DecodeHeader accepts Encode writes back unchanged.
func (h *Header) validate() error {
	switch {
	case h.Version != HeaderVersion:
		return fmt.Errorf("version %d, want %d", h.Version, HeaderVersion)
	case h.State != StateInitialising && h.State != StateReady:
		return fmt.Errorf("invalid state %d", h.State)
	case h.Mode != ModeCrypt && h.Mode != ModeAuthenticated:
		return fmt.Errorf("invalid mode %d", h.Mode)
	case h.Filesystem != FilesystemExt4 && h.Filesystem != FilesystemXFS:
		return fmt.Errorf("invalid filesystem %q", h.Filesystem)
	case h.PartitionID.IsZero():
		return errors.New("zero partition ID")
	case len(h.KeyPolicy) == 0 || len(h.KeyPolicy) > maxPolicy:
		return fmt.Errorf("key policy of %d bytes, want 1..%d", len(h.KeyPolicy), maxPolicy)
	}
	for _, c := range []byte(h.KeyPolicy) {
		if c < 0x21 || c > 0x7e {
			return fmt.Errorf("key policy %q is not printable ASCII", h.KeyPolicy)
		}
	}
	return nil
}

// Encode returns one slot: exactly SlotSize bytes, zero-padded after the
// checksum. It fails with ErrHeaderTooLarge if the sealed key does not fit
// and with a plain error if a field is invalid.
func (h *Header) Encode() ([]byte, error) {
	if err := h.validate(); err != nil {
		return nil, fmt.Errorf("storage: encode header: %w", err)
	}
	body := make([]byte, 0, 64+len(h.SealedKey))
	body = binary.LittleEndian.AppendUint64(body, h.Sequence)
	body = append(body, byte(h.State), byte(h.Mode))
	body = binary.LittleEndian.AppendUint64(body, h.Created)
	body = append(body, h.PartitionID[:]...)
	body = append(body, byte(len(h.Filesystem)))
	body = append(body, h.Filesystem...)
	body = append(body, byte(len(h.KeyPolicy)))
	body = append(body, h.KeyPolicy...)
	if len(h.SealedKey) > math.MaxUint16 || len(body)+2+len(h.SealedKey) > maxBody {
		return nil, fmt.Errorf("%w: sealed key of %d bytes, at most %d fit", ErrHeaderTooLarge,
			len(h.SealedKey), maxBody-len(body)-2)
	}
	body = binary.LittleEndian.AppendUint16(body, uint16(len(h.SealedKey)))
	body = append(body, h.SealedKey...)
	if len(h.Enrolment) > 0 {
		if len(body)+2+len(h.Enrolment) > maxBody {
			return nil, fmt.Errorf("%w: enrolment data of %d bytes, at most %d fit", ErrHeaderTooLarge,
				len(h.Enrolment), maxBody-len(body)-2)
		}
		body = binary.LittleEndian.AppendUint16(body, uint16(len(h.Enrolment)))
		body = append(body, h.Enrolment...)
	}

	b := make([]byte, SlotSize)
	copy(b, magic)
	binary.LittleEndian.PutUint16(b[len(magic):], h.Version)
	binary.LittleEndian.PutUint32(b[len(magic)+2:], uint32(len(body)))
	copy(b[prefixLen:], body)
	end := prefixLen + len(body)
	sum := sha256.Sum256(b[:end])
	copy(b[end:], sum[:])
	return b, nil
}

func allZero(b []byte) bool {
	for _, c := range b {
		if c != 0 {
			return false
		}
	}
	return true
}

// DecodeHeader decodes one slot (SlotSize bytes). The errors are distinct
// so that damage is never mistaken for blankness:
//   - ErrNoHeader: no magic and every byte zero;
//   - ErrNotPlinth: no magic, some byte non-zero (foreign data);
//   - ErrCorruptHeader: the magic is there but the length, checksum,
//     padding or a field is wrong, or b is not SlotSize bytes long;
//   - ErrUnsupportedVersion (an ErrCorruptHeader): valid checksum, unknown
//     version.
func DecodeHeader(b []byte) (*Header, error) {
	if !bytes.HasPrefix(b, []byte(magic)) {
		switch {
		case allZero(b):
			return nil, ErrNoHeader
		case len(b) < len(magic) && bytes.HasPrefix([]byte(magic), b):
			return nil, fmt.Errorf("%w: truncated to %d bytes", ErrCorruptHeader, len(b))
		}
		return nil, ErrNotPlinth
	}
	if len(b) != SlotSize {
		return nil, fmt.Errorf("%w: %d bytes, want %d", ErrCorruptHeader, len(b), SlotSize)
	}
	le := binary.LittleEndian
	version := le.Uint16(b[len(magic):])
	n := le.Uint32(b[len(magic)+2:])
	if n > uint32(maxBody) {
		return nil, fmt.Errorf("%w: body length %d, at most %d", ErrCorruptHeader, n, maxBody)
	}
	end := prefixLen + int(n)
	sum := sha256.Sum256(b[:end])
	if !bytes.Equal(sum[:], b[end:end+checksumLen]) {
		return nil, fmt.Errorf("%w: checksum mismatch", ErrCorruptHeader)
	}
	// Checked after the checksum, so a damaged version field reads as
	// corruption and only a header really written by another version
	// reads as unsupported.
	if version != HeaderVersion {
		return nil, fmt.Errorf("%w %d (this code reads %d)", ErrUnsupportedVersion, version, HeaderVersion)
	}
	if !allZero(b[end+checksumLen:]) {
		return nil, fmt.Errorf("%w: non-zero bytes after the checksum", ErrCorruptHeader)
	}
	h, err := decodeBody(b[prefixLen:end])
	if err != nil {
		return nil, fmt.Errorf("%w: %v", ErrCorruptHeader, err)
	}
	h.Version = version
	if err := h.validate(); err != nil {
		return nil, fmt.Errorf("%w: %v", ErrCorruptHeader, err)
	}
	return h, nil
}

func decodeBody(body []byte) (*Header, error) {
	d := decoder{b: body}
	h := &Header{}
	h.Sequence = d.uint64()
	h.State = State(d.byte())
	h.Mode = Mode(d.byte())
	h.Created = d.uint64()
	copy(h.PartitionID[:], d.bytes(16))
	h.Filesystem = string(d.bytes(int(d.byte())))
	h.KeyPolicy = string(d.bytes(int(d.byte())))
	if key := d.bytes(int(d.uint16())); len(key) > 0 {
		h.SealedKey = append([]byte(nil), key...)
	}
	if len(d.b) > 0 && !d.short {
		n := int(d.uint16())
		if n == 0 {
			return nil, errors.New("empty enrolment field")
		}
		h.Enrolment = append([]byte(nil), d.bytes(n)...)
	}
	if d.short {
		return nil, errors.New("body ends inside a field")
	}
	if len(d.b) != 0 {
		return nil, fmt.Errorf("%d unexpected bytes after the last field", len(d.b))
	}
	return h, nil
}

// decoder reads little-endian fields; running short sets short and yields
// zeros, so decodeBody checks once at the end.
type decoder struct {
	b     []byte
	short bool
}

func (d *decoder) bytes(n int) []byte {
	if n > len(d.b) {
		d.short, d.b = true, nil
		return make([]byte, n)
	}
	v := d.b[:n]
	d.b = d.b[n:]
	return v
}

func (d *decoder) byte() byte     { return d.bytes(1)[0] }
func (d *decoder) uint16() uint16 { return binary.LittleEndian.Uint16(d.bytes(2)) }
func (d *decoder) uint64() uint64 { return binary.LittleEndian.Uint64(d.bytes(8)) }

// SlotState is what ReadHeader found in one slot.
type SlotState struct {
	Err      error  // nil if the slot holds a valid header
	Sequence uint64 // the valid header's sequence number
}

// HeaderReport tells which slot ReadHeader used and what the other held.
type HeaderReport struct {
	Used  int // slot of the returned header, -1 if none
	Slots [2]SlotState
}

// Degraded reports whether the slots do not both hold the header of one
// complete WriteHeader: one is damaged, blank or stale. Writing the
// returned header again (WriteHeader) restores the redundancy.
func (r HeaderReport) Degraded() bool {
	s0, s1 := r.Slots[0], r.Slots[1]
	if s0.Err != nil || s1.Err != nil {
		return true
	}
	// One complete WriteHeader leaves consecutive sequence numbers, in
	// either slot order.
	return s0.Sequence != s1.Sequence+1 && s1.Sequence != s0.Sequence+1
}

// ReadHeader reads the HeaderSize region at offset (the partition start)
// and returns the valid header with the highest sequence number. A damaged
// or stale other slot is not an error; the report says so (Degraded).
//
// Errors when no slot is valid, most serious first:
//   - ErrUnsupportedVersion if either slot holds one, even next to a valid
//     slot: a newer Plinth wrote here, and an older copy may be stale;
//   - ErrHeaderIncomplete if slot 0 holds the intent marker (and nothing
//     else) and slot 1 is not valid: the first WriteHeader was cut;
//   - ErrNoHeader if the whole region is zero;
//   - ErrCorruptHeader if a slot holds a damaged Plinth header or a
//     damaged intent marker;
//   - ErrNotPlinth for foreign data;
//   - a read error as is.
//
// A zero slot 0 next to an invalid, non-zero slot 1 is therefore an error
// (ErrCorruptHeader or ErrNotPlinth), never ErrNoHeader.
func ReadHeader(r io.ReaderAt, offset int64) (*Header, HeaderReport, error) {
	rep := HeaderReport{Used: -1}
	buf := make([]byte, HeaderSize)
	if n, err := r.ReadAt(buf, offset); n != len(buf) {
		if err == nil || err == io.EOF {
			err = io.ErrUnexpectedEOF
		}
		return nil, rep, fmt.Errorf("storage: read header at %d: %w", offset, err)
	}
	var hs [2]*Header
	for i := range hs {
		h, err := DecodeHeader(buf[i*SlotSize : (i+1)*SlotSize])
		if i == 0 && errors.Is(err, ErrNotPlinth) {
			err = intentState(buf[:SlotSize])
		}
		if err == nil && h.Sequence%2 != uint64(i) {
			h, err = nil, fmt.Errorf("%w: sequence %d does not belong in slot %d", ErrCorruptHeader, h.Sequence, i)
		}
		hs[i] = h
		rep.Slots[i].Err = err
		if h != nil {
			rep.Slots[i].Sequence = h.Sequence
		}
	}
	e0, e1 := rep.Slots[0].Err, rep.Slots[1].Err
	both := func(err error) error {
		return fmt.Errorf("%w (slot 0: %v; slot 1: %v)", err, e0, e1)
	}
	switch {
	case errors.Is(e0, ErrUnsupportedVersion) || errors.Is(e1, ErrUnsupportedVersion):
		return nil, rep, both(ErrUnsupportedVersion)
	case hs[0] != nil && (hs[1] == nil || hs[0].Sequence > hs[1].Sequence):
		rep.Used = 0
	case hs[1] != nil:
		rep.Used = 1
	case errors.Is(e0, errIntentMarker):
		return nil, rep, both(ErrHeaderIncomplete)
	case errors.Is(e0, ErrNoHeader) && errors.Is(e1, ErrNoHeader):
		return nil, rep, ErrNoHeader
	case errors.Is(e0, ErrCorruptHeader) || errors.Is(e1, ErrCorruptHeader):
		return nil, rep, both(ErrCorruptHeader)
	default:
		return nil, rep, both(ErrNotPlinth)
	}
	return hs[rep.Used], rep, nil
}

// intentState classifies a slot 0 that holds no header magic but is not
// zero: the intent marker (errIntentMarker), a damaged one
// (ErrCorruptHeader: its sector followed by non-zero bytes, as a torn
// third step of the first write leaves), or foreign data (ErrNotPlinth).
func intentState(slot []byte) error {
	if !bytes.HasPrefix(slot, []byte(intentMagic)) {
		return ErrNotPlinth
	}
	if allZero(slot[len(intentMagic):]) {
		return errIntentMarker
	}
	return fmt.Errorf("%w: damaged intent marker", ErrCorruptHeader)
}

// syncer is implemented by *os.File; WriteHeader flushes with it so the
// first copy is on the medium before the second is touched.
type syncer interface{ Sync() error }

// WriteHeader writes h into both slots of the region at offset: first
// sequence h.Sequence+1 into the slot of its parity (odd: slot 1, even:
// slot 0), then h.Sequence+2 into the other, flushing after each (if w has
// Sync). The first write therefore never touches the slot holding
// h.Sequence, the newest valid copy: after a cut in either write, one
// valid copy remains, even when an earlier cut left only one. On success
// h.Sequence is the sequence of the second copy. h.Sequence must be the
// sequence of the newest header on disk (as ReadHeader returned it) or 0
// for a blank region (or one ReadHeader called ErrHeaderIncomplete). For
// such a region WriteHeader first writes the intent marker into slot 0
// and flushes (see the package doc), and h must be StateInitialising: an
// unfinished first write then always means "setup never began". An
// invalid header is rejected before anything is written.
func WriteHeader(w io.WriterAt, offset int64, h *Header) error {
	if h.Sequence > math.MaxUint64-3 {
		return errors.New("storage: header sequence exhausted")
	}
	first := h.Sequence == 0
	if first && h.State != StateInitialising {
		return fmt.Errorf("storage: the first header written to a blank region must be %v, not %v", StateInitialising, h.State)
	}
	type write struct {
		what string
		b    []byte
		off  int64
	}
	var writes []write
	if first {
		marker := make([]byte, intentSize)
		copy(marker, intentMagic)
		writes = append(writes, write{"intent marker", marker, offset})
	}
	c := *h
	for range 2 {
		c.Sequence++
		b, err := c.Encode()
		if err != nil {
			return err
		}
		slot := int(c.Sequence % 2)
		writes = append(writes, write{fmt.Sprintf("header slot %d", slot), b, offset + int64(slot)*SlotSize})
	}
	for _, wr := range writes {
		if _, err := w.WriteAt(wr.b, wr.off); err != nil {
			return fmt.Errorf("storage: write %s: %w", wr.what, err)
		}
		if sy, ok := w.(syncer); ok {
			if err := sy.Sync(); err != nil {
				return fmt.Errorf("storage: sync %s: %w", wr.what, err)
			}
		}
	}
	h.Sequence = c.Sequence
	return nil
}
