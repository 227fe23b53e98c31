// Package eventlog parses and replays the TCG PC Client "crypto-agile" event
// log in which UEFI firmware records every measurement it extends into the
// TPM 2.0 PCRs before the operating system starts. Linux copies the log out
// of firmware memory and exposes it at [DefaultPath] (securityfs).
//
// # Why
//
// PCR 4 holds, among a few fixed markers, the Authenticode digest of every
// EFI application the firmware starts: for a plinth node the Unified Kernel
// Image (UKI) and then the kernel that the systemd stub inside it starts
// through the firmware's LoadImage. A secret sealed to PCR 4 therefore opens
// only when the same UKI boots. Before /init switches the node to a new UKI
// it must know the PCR 4 value that UKI will produce, to seal the data-disk
// key to it. The other PCR 4 events (the firmware's "Calling EFI Application
// from Boot Option" and "Returning from ..." actions, the separator) do not
// depend on the UKI, so the prediction is this boot's log replayed with the
// application digests swapped for the new UKI's and its kernel's
// ([PredictPCR4]). What OVMF logged in PCR 4 when it booted a UKI from disk
// after first trying the (empty) DVD drive:
//
//	this boot's log (PCR 4 events)              replayed for the next UKI
//	EV_EFI_ACTION "Calling EFI Application..."  same digest
//	EV_SEPARATOR                                same digest
//	EV_EFI_ACTION "Returning from EFI App..."   same digest  (DVD option failed)
//	EV_EFI_ACTION "Calling EFI Application..."  same digest
//	EV_EFI_BOOT_SERVICES_APPLICATION            Authenticode(new UKI)
//	EV_EFI_BOOT_SERVICES_APPLICATION            Authenticode(new UKI's kernel)
//
//	PCR 4 = extend(...extend(extend(0, d1), d2)..., dn)
//	extend(pcr, d) = SHA-256(pcr || d)
//
// The prediction holds if the next boot takes the same path: the same boot
// options tried and failed before the UKI (each failed attempt adds a
// "Returning"/"Calling" pair) and the same number of applications started.
//
// # Format
//
// All integers are little-endian. The first event is in the old SHA-1-only
// TCG_PCR_EVENT layout and is not a measurement: it is an EV_NO_ACTION event
// whose data, the TCG_EfiSpecIDEvent, names the log format ("Spec ID
// Event03") and lists the hash algorithms (TPM banks) every later event
// carries a digest for, with their digest sizes. The sizes are needed to
// parse the rest: a TPML_DIGEST_VALUES holds no lengths of its own.
//
//	TCG_PCR_EVENT (header, once)           TCG_EfiSpecIDEvent (its data)
//	+----------------------------+         +---------------------------------+
//	| u32 PCR index (0)          |         | "Spec ID Event03\0"  (16 bytes) |
//	| u32 type (EV_NO_ACTION)    |         | u32 platform class              |
//	| [20]byte SHA-1 digest (0)  |         | u8 ver minor, major, errata,    |
//	| u32 data size              |         | u8 uintn size                   |
//	| data ----------------------+-------> | u32 n; n x {u16 alg, u16 size}  |
//	+----------------------------+         | u8 vendor size; vendor bytes    |
//	                                       +---------------------------------+
//	TCG_PCR_EVENT2 (repeated to the end of the log)
//	+----------------------------------------------+
//	| u32 PCR index                                |
//	| u32 type                                     |
//	| u32 count; count x {u16 alg, digest[size]}   |  <- TPML_DIGEST_VALUES
//	| u32 data size                                |
//	| data                                         |
//	+----------------------------------------------+
//	  [optional 0xFF or 0x00 padding]
//
// A digest is normally the hash of the event data, but not always (the
// firmware hashes an image's Authenticode form, not the logged device path),
// so replaying uses the logged digests and never re-hashes the data.
package eventlog

import (
	"bytes"
	"crypto/sha1"
	"crypto/sha256"
	"crypto/sha512"
	"encoding/binary"
	"errors"
	"fmt"
	"hash"
	"os"
)

// DefaultPath is where Linux exposes the firmware's TPM 2.0 event log.
const DefaultPath = "/sys/kernel/security/tpm0/binary_bios_measurements"

// Event types used here (TCG PC Client PFP spec).
const (
	// EvNoAction marks an event that is logged but not extended into any
	// PCR: the Spec ID header, StartupLocality and similar informational
	// events.
	EvNoAction uint32 = 0x00000003
	// EvSeparator separates pre-OS from OS-present measurements in PCRs 0-7.
	EvSeparator uint32 = 0x00000004
	// EvEFIBootServicesApplication is an EFI application (a boot loader, a
	// UKI, an EFI-stub kernel) started by the firmware's LoadImage; the
	// digest is the image's Authenticode hash.
	EvEFIBootServicesApplication uint32 = 0x80000003
	// EvEFIAction is a firmware action, such as "Calling EFI Application
	// from Boot Option"; the data is the ASCII action string.
	EvEFIAction uint32 = 0x80000007
)

// AlgSHA256 is TPM_ALG_SHA256.
const AlgSHA256 uint16 = 0x000B

// Other TPM_ALG_IDs the replay knows how to extend with.
const (
	algSHA1   uint16 = 0x0004
	algSHA384 uint16 = 0x000C
	algSHA512 uint16 = 0x000D
	algSM3    uint16 = 0x0012
)

// Event is one entry of the log.
type Event struct {
	Index   int               // position in the log, 0-based (the Spec ID header event is 0)
	PCR     uint32            // PCR index the event was extended into (or logged for)
	Type    uint32            // event type, e.g. EvEFIBootServicesApplication
	Digests map[uint16][]byte // by TPM_ALG_ID
	Data    []byte            // event data, as logged
}

// ErrNotCryptoAgile is returned by Parse for a log whose first event is not
// the "Spec ID Event03" header: a SHA-1-only legacy (TPM 1.2 format) log.
var ErrNotCryptoAgile = errors.New("eventlog: not a crypto-agile TPM 2.0 event log (no Spec ID Event03 header)")

const (
	specIDSignature   = "Spec ID Event03\x00"
	startupLocality   = "StartupLocality\x00"
	sha1EventDigest   = 20         // digest size in the TCG_PCR_EVENT header
	pcrEndOfLog       = 0xFFFFFFFF // PCR index that ends the log
	minZeroPaddingLen = 8          // see isPadding
)

// knownDigestSizes are the digest sizes of the algorithms a Spec ID header
// may list that this package knows; the header must agree with them.
var knownDigestSizes = map[uint16]int{
	algSHA1:   sha1.Size,
	AlgSHA256: sha256.Size,
	algSHA384: sha512.Size384,
	algSHA512: sha512.Size,
	algSM3:    32,
}

// Read reads and parses the log at path (normally DefaultPath).
func Read(path string) ([]Event, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("eventlog: %w", err)
	}
	return Parse(b)
}

// Parse decodes a crypto-agile log: the first event in the TCG_PCR_EVENT
// (SHA-1) format carrying the TCG_EfiSpecIDEvent ("Spec ID Event03", listing
// algorithms and digest sizes), then TCG_PCR_EVENT2 events until the end of
// b. Trailing padding after the last event (only 0xFF bytes, or at least 8
// 0x00 bytes) or an event with PCR index 0xFFFFFFFF ends the log early.
//
// The returned events start with the header (Index 0, EvNoAction, its
// 20-byte SHA-1 field as the only digest) and copy their data out of b.
// A log that is not crypto-agile returns an error wrapping
// ErrNotCryptoAgile; a truncated or malformed one returns another error.
func Parse(b []byte) ([]Event, error) {
	r := &reader{b: b}

	// Header: TCG_PCR_EVENT.
	pcr := r.u32()
	typ := r.u32()
	digest := r.bytes(sha1EventDigest)
	data := r.bytes(int(r.u32()))
	if r.err != nil {
		return nil, fmt.Errorf("eventlog: header event: %w", r.err)
	}
	if pcr != 0 || typ != EvNoAction || !bytes.HasPrefix(data, []byte(specIDSignature)) {
		return nil, ErrNotCryptoAgile
	}
	sizes, err := parseSpecID(data)
	if err != nil {
		return nil, err
	}
	events := []Event{{
		Index:   0,
		PCR:     pcr,
		Type:    typ,
		Digests: map[uint16][]byte{algSHA1: bytes.Clone(digest)},
		Data:    bytes.Clone(data),
	}}

	// TCG_PCR_EVENT2 events.
	for r.off < len(b) && !isPadding(b[r.off:]) {
		start := r.off
		ev := Event{Index: len(events), PCR: r.u32()}
		if r.err == nil && ev.PCR == pcrEndOfLog {
			break
		}
		ev.Type = r.u32()
		count := r.u32()
		if r.err == nil && count > uint32(len(sizes)) {
			return nil, fmt.Errorf("eventlog: event %d (offset %d): %d digests, the header lists %d algorithms", ev.Index, start, count, len(sizes))
		}
		ev.Digests = make(map[uint16][]byte, count)
		for i := uint32(0); i < count && r.err == nil; i++ {
			alg := r.u16()
			if r.err != nil {
				break
			}
			size, ok := sizes[alg]
			if !ok {
				return nil, fmt.Errorf("eventlog: event %d (offset %d): digest algorithm 0x%04x not in the header", ev.Index, start, alg)
			}
			if _, dup := ev.Digests[alg]; dup {
				return nil, fmt.Errorf("eventlog: event %d (offset %d): two digests for algorithm 0x%04x", ev.Index, start, alg)
			}
			d := r.bytes(size)
			ev.Digests[alg] = bytes.Clone(d)
		}
		ev.Data = bytes.Clone(r.bytes(int(r.u32())))
		if r.err != nil {
			return nil, fmt.Errorf("eventlog: event %d (offset %d): %w", ev.Index, start, r.err)
		}
		events = append(events, ev)
	}
	return events, nil
}

// parseSpecID decodes the TCG_EfiSpecIDEvent in the header's data and
// returns the digest size of each listed algorithm.
func parseSpecID(data []byte) (map[uint16]int, error) {
	r := &reader{b: data}
	r.bytes(len(specIDSignature))
	r.u32()      // platform class
	r.bytes(3)   // spec version minor, major, errata
	r.bytes(1)   // uintn size
	n := r.u32() // number of algorithms
	if r.err == nil && (n == 0 || uint64(n)*4 > uint64(len(data)-r.off)) {
		return nil, fmt.Errorf("eventlog: Spec ID header: bad algorithm count %d", n)
	}
	sizes := make(map[uint16]int, n)
	for i := uint32(0); i < n && r.err == nil; i++ {
		alg, size := r.u16(), int(r.u16())
		if r.err != nil {
			break
		}
		if _, dup := sizes[alg]; dup {
			return nil, fmt.Errorf("eventlog: Spec ID header: algorithm 0x%04x listed twice", alg)
		}
		if want, ok := knownDigestSizes[alg]; (ok && size != want) || size == 0 {
			return nil, fmt.Errorf("eventlog: Spec ID header: algorithm 0x%04x with digest size %d", alg, size)
		}
		sizes[alg] = size
	}
	r.bytes(int(r.u8())) // vendor info
	if r.err != nil {
		return nil, fmt.Errorf("eventlog: Spec ID header: %w", r.err)
	}
	return sizes, nil
}

// isPadding reports whether rest, the bytes after the last parsed event, is
// padding rather than a further event: all 0xFF (a PCR index of
// 0xFFFFFFFF, or less than one), or all 0x00 and at least 8 bytes long (PCR
// 0 with event type 0, which firmware never logs). Shorter runs of zeros
// are the start of a truncated PCR 0 event, which must fail.
func isPadding(rest []byte) bool {
	if len(rest) == 0 {
		return true
	}
	switch rest[0] {
	case 0xFF:
		return len(bytes.Trim(rest, "\xff")) == 0
	case 0x00:
		return len(rest) >= minZeroPaddingLen && len(bytes.Trim(rest, "\x00")) == 0
	}
	return false
}

// reader is a bounds-checked little-endian cursor. After the first short
// read every further read fails too and returns zero values, so a parser
// can check r.err once per group of fields.
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
		r.err = fmt.Errorf("truncated: need %d bytes at offset %d, have %d", n, r.off, len(r.b)-r.off)
		return nil
	}
	out := r.b[r.off : r.off+n : r.off+n]
	r.off += n
	return out
}

func (r *reader) u8() uint8 {
	if b := r.bytes(1); b != nil {
		return b[0]
	}
	return 0
}

func (r *reader) u16() uint16 {
	if b := r.bytes(2); b != nil {
		return binary.LittleEndian.Uint16(b)
	}
	return 0
}

func (r *reader) u32() uint32 {
	if b := r.bytes(4); b != nil {
		return binary.LittleEndian.Uint32(b)
	}
	return 0
}

// newHash returns the hash function of a PCR bank.
func newHash(alg uint16) (func() hash.Hash, error) {
	switch alg {
	case algSHA1:
		return sha1.New, nil
	case AlgSHA256:
		return sha256.New, nil
	case algSHA384:
		return sha512.New384, nil
	case algSHA512:
		return sha512.New, nil
	}
	return nil, fmt.Errorf("eventlog: unsupported hash algorithm 0x%04x", alg)
}

// Replay returns the value of pcr in bank alg after extending, from the
// initial value, every event of that PCR except EV_NO_ACTION, in log order:
// pcr = H(pcr || digest).
//
// The initial value is all zeros, except for PCR 0 when an EV_NO_ACTION
// "StartupLocality\0" event (data: the 16-byte signature "StartupLocality\0",
// then one byte locality) says locality 3 or 4: then the last byte of the
// initial value is that locality, as the TPM sets it when started from that
// locality. An extended event lacking a digest in alg, or with a digest of
// the wrong size, is an error, as is a bank this package cannot hash
// (supported: SHA-1, SHA-256, SHA-384, SHA-512).
func Replay(events []Event, pcr uint32, alg uint16) ([]byte, error) {
	newH, err := newHash(alg)
	if err != nil {
		return nil, err
	}
	h := newH()
	value := make([]byte, h.Size())
	for _, ev := range events {
		if ev.PCR != pcr {
			continue
		}
		if ev.Type == EvNoAction {
			if pcr == 0 && len(ev.Data) >= len(startupLocality)+1 && string(ev.Data[:len(startupLocality)]) == startupLocality {
				if loc := ev.Data[len(startupLocality)]; loc == 3 || loc == 4 {
					value[len(value)-1] = loc
				}
			}
			continue
		}
		d, ok := ev.Digests[alg]
		if !ok {
			return nil, fmt.Errorf("eventlog: event %d (PCR %d, type 0x%08x) has no digest for algorithm 0x%04x", ev.Index, ev.PCR, ev.Type, alg)
		}
		if len(d) != len(value) {
			return nil, fmt.Errorf("eventlog: event %d (PCR %d): %d-byte digest for algorithm 0x%04x, want %d", ev.Index, ev.PCR, len(d), alg, len(value))
		}
		h.Reset()
		h.Write(value)
		h.Write(d)
		value = h.Sum(value[:0])
	}
	return value, nil
}

// isApplication reports whether ev is the firmware's measurement of an EFI
// application it started, in PCR 4.
func isApplication(ev *Event) bool {
	return ev.PCR == 4 && ev.Type == EvEFIBootServicesApplication
}

// Applications returns the SHA-256 digests of the PCR 4
// EV_EFI_BOOT_SERVICES_APPLICATION events, in order: the Authenticode
// digests of the images the firmware started. With OVMF and systemd-stub
// 252 that is the UKI, then the kernel the stub starts through LoadImage. An
// event without a SHA-256 digest gives a nil entry.
func Applications(events []Event) [][]byte {
	var apps [][]byte
	for i := range events {
		if isApplication(&events[i]) {
			apps = append(apps, events[i].Digests[AlgSHA256])
		}
	}
	return apps
}

// PredictPCR4 returns PCR 4 (SHA-256 bank) as it would be if this boot had
// loaded other images: the log is replayed with the digests of the
// EV_EFI_BOOT_SERVICES_APPLICATION events in PCR 4 replaced, in order, by
// apps (the Authenticode SHA-256 digests of the images the boot starts: the
// UKI, then the kernel the systemd stub starts through the firmware). It is
// an error if the log holds a different number of such events than
// len(apps), or if a digest in apps is not 32 bytes. events is not modified.
func PredictPCR4(events []Event, apps [][]byte) ([]byte, error) {
	var pcr4 []Event
	n := 0
	for i := range events {
		ev := events[i]
		if ev.PCR != 4 {
			continue
		}
		if isApplication(&ev) {
			if n >= len(apps) {
				return nil, fmt.Errorf("eventlog: the log has more than %d EFI application events in PCR 4", len(apps))
			}
			if len(apps[n]) != sha256.Size {
				return nil, fmt.Errorf("eventlog: application digest %d is %d bytes, want %d", n, len(apps[n]), sha256.Size)
			}
			ev.Digests = map[uint16][]byte{AlgSHA256: apps[n]}
			n++
		}
		pcr4 = append(pcr4, ev)
	}
	if n != len(apps) {
		return nil, fmt.Errorf("eventlog: the log has %d EFI application events in PCR 4, %d digests given", n, len(apps))
	}
	return Replay(pcr4, 4, AlgSHA256)
}

// Firmware actions (EV_EFI_ACTION data) in PCR 4 around boot attempts.
const (
	actionCalling   = "Calling EFI Application from Boot Option"
	actionReturning = "Returning from EFI Application from Boot Option"
)

// FirstBootAttempt returns events as they would be if the boot had
// started its application at the firmware's first boot attempt. EDK2
// measures "Calling EFI Application from Boot Option" into PCR 4 at the
// first attempt and, at every later one (a DVD drive tried first, found
// empty), "Returning from EFI Application from Boot Option" and
// "Calling ..." again. A boot through BootNext, or through a boot entry
// first in BootOrder, makes one attempt: this is the log such a boot
// replays, which an update predicts the new slot's PCR 4 from.
func FirstBootAttempt(events []Event) []Event {
	out := make([]Event, 0, len(events))
	calling := false
	for _, ev := range events {
		if ev.PCR == 4 && ev.Type == EvEFIAction {
			switch string(bytes.TrimRight(ev.Data, "\x00")) {
			case actionReturning:
				continue
			case actionCalling:
				if calling {
					continue
				}
				calling = true
			}
		}
		out = append(out, ev)
	}
	return out
}
