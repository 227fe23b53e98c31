package update

import (
	"crypto/ed25519"
	"encoding/json"
	"fmt"
	"plinth.dev/plinth/platform/releasekeys"
	"strconv"
	"strings"
	"time"
)

// Signed, monotonic updates: which images a node installs at all.
//
//	builder (plinthctl build --sign-key K --release N)
//	  manifest.json  {"release": N, "release_key": hex(K.pub), ...}
//	  manifest.sig   ed25519 signature by K over manifest.json's bytes (64 raw bytes)
//	  system image   /etc/os-release PLINTH_RELEASE=N, /etc/plinth/release.pub
//	node (Begin, before a byte of the slot is written)
//	  the cluster's release keys: its chain of key sets (platform/releasekeys),
//	  verified by the node from where it stands (Trust)
//	  ─► none: refused; no signature: refused; verifies with none: refused
//	  ─► N < the running image's PLINTH_RELEASE: refused unless a downgrade
//	     statement for release N, signed by a current key and not expired,
//	     comes with it
//
// Why: the owner's certificate lets a tool push images, but whoever holds
// it (or a compromised consensus member, which holds the cluster's keys)
// must not be able to install an image the owner's offline release key
// did not sign, nor roll a node back to an older signed image with a
// known hole: the release keys and a downgrade's permission are
// statements only a release key signs. The release number orders images; versions (commit hashes)
// do not. Release 0 is an unreleased build: installing it over a
// released image is a downgrade like any other.

// Request is an update as the owner's tool asks for it: the image's
// manifest and its signature as sent, and what the node checks them
// against.
type Request struct {
	// Manifest is manifest.json's exact bytes, Signature manifest.sig's
	// (empty: the image is unsigned).
	Manifest, Signature []byte
	// ReleaseKeys are the cluster's newest key set as the node verified
	// it (Trust.Follow), ed25519 public keys.
	ReleaseKeys [][]byte
	// Downgrade, if set, is a downgrade statement: with it an image
	// older than the running one may be installed (logged at Warn).
	Downgrade *releasekeys.Signed
}

// Refusal is why CheckRelease refuses an image.
type Refusal int

const (
	// RefusedNoKeys: the cluster names no release key, so no image can
	// be trusted.
	RefusedNoKeys Refusal = iota + 1
	// RefusedUnsigned: no signature came with the manifest.
	RefusedUnsigned
	// RefusedSignature: the signature verifies against none of the
	// cluster's keys: another key signed it, or the manifest was changed
	// after it was signed.
	RefusedSignature
	// RefusedDowngrade: the image's release is older than the running
	// image's, and no valid downgrade statement allowed it.
	RefusedDowngrade
)

// ReleaseError is CheckRelease's refusal. It is an ErrRejected
// (errors.Is), so the node's API maps it as every other refusal; callers
// that care which one use errors.As and Refusal.
type ReleaseError struct {
	Refusal Refusal
	// Keys is how many release keys the cluster has.
	Keys int
	// Release is the image's release, Running the running image's
	// (RefusedDowngrade).
	Release, Running uint64
	// Signer is the release key the manifest names (hex, unverified),
	// when a signature did not verify: the key to compare with the
	// cluster's (plinthctl cluster policy).
	Signer string
	// Detail says what was wrong with a downgrade statement.
	Detail string
}

func (e *ReleaseError) Error() string {
	var why string
	switch e.Refusal {
	case RefusedNoKeys:
		why = "the cluster has no release keys: add one with plinthctl cluster policy --add-release-key"
	case RefusedUnsigned:
		why = "the image is not signed (no manifest.sig)"
	case RefusedSignature:
		plural := "s"
		if e.Keys == 1 {
			plural = ""
		}
		why = fmt.Sprintf("the image's signature does not verify against any of the cluster's %d release key%s", e.Keys, plural)
		if e.Signer != "" {
			why += " (its manifest names release key " + e.Signer + ")"
		}
	case RefusedDowngrade:
		why = fmt.Sprintf("release %d is older than the running release %d: %s (plinthctl node update --allow-downgrade --sign-key RELEASE-KEY signs one)", e.Release, e.Running, e.Detail)
	default:
		why = fmt.Sprintf("release check %d", e.Refusal)
	}
	return ErrRejected.Error() + ": " + why
}

func (e *ReleaseError) Unwrap() error { return ErrRejected }

// CheckRelease decides whether an image may be installed on a node
// running release running, at now: its signature over the manifest's
// exact bytes must verify against one of keys, and its release must not
// be older than running unless downgrade allows it (a statement signed
// by one of keys, naming this release, not expired). Equal releases pass
// (the same release again, e.g. after a failed update). It returns the
// image's release. Nothing but the manifest's bytes is trusted: the
// release is read only once the signature holds.
func CheckRelease(manifest, signature []byte, keys [][]byte, running uint64, downgrade *releasekeys.Signed, now time.Time) (uint64, error) {
	if len(keys) == 0 {
		return 0, &ReleaseError{Refusal: RefusedNoKeys}
	}
	if len(signature) == 0 {
		return 0, &ReleaseError{Refusal: RefusedUnsigned, Keys: len(keys)}
	}
	verified := false
	for _, k := range keys {
		// ed25519.Verify panics on a key of another size; the curator
		// refuses those, a key that slipped through verifies nothing.
		if len(k) == ed25519.PublicKeySize && ed25519.Verify(ed25519.PublicKey(k), manifest, signature) {
			verified = true
			break
		}
	}
	var m struct {
		Release    uint64 `json:"release"`
		ReleaseKey string `json:"release_key"`
	}
	jerr := json.Unmarshal(manifest, &m)
	if !verified {
		return 0, &ReleaseError{Refusal: RefusedSignature, Keys: len(keys), Signer: m.ReleaseKey}
	}
	if jerr != nil {
		return 0, fmt.Errorf("%w: manifest: %v", ErrRejected, jerr)
	}
	if m.Release < running {
		if why := releasekeys.CheckDowngrade(downgrade, keys, m.Release, now); why != "" {
			return 0, &ReleaseError{Refusal: RefusedDowngrade, Keys: len(keys), Release: m.Release, Running: running, Detail: why}
		}
	}
	return m.Release, nil
}

// OSRelease is what an update reads of the running image's os-release.
type OSRelease struct {
	// Version is VERSION_ID.
	Version string
	// Release is PLINTH_RELEASE, 0 without one (an image built before
	// releases were numbered, or unreleased).
	Release uint64
}

// ParseOSRelease reads an os-release file's VERSION_ID and
// PLINTH_RELEASE. A PLINTH_RELEASE that is not a number is an error: the
// node would otherwise take itself for release 0 and accept any image.
func ParseOSRelease(data []byte) (OSRelease, error) {
	var r OSRelease
	for _, l := range strings.Split(string(data), "\n") {
		k, v, ok := strings.Cut(strings.TrimSpace(l), "=")
		if !ok {
			continue
		}
		v = strings.Trim(v, `"`)
		switch k {
		case "VERSION_ID":
			r.Version = v
		case "PLINTH_RELEASE":
			n, err := strconv.ParseUint(v, 10, 64)
			if err != nil {
				return OSRelease{}, fmt.Errorf("os-release: PLINTH_RELEASE=%q is not a release number", v)
			}
			r.Release = n
		}
	}
	return r, nil
}
