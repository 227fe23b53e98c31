package releasekeys

import (
	"bytes"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"slices"
	"time"
)

// Trust is where a node stands in its cluster's chain of release keys
// (keychain.go): kept on its data volume, it only moves forward.
type Trust struct {
	// Version and Digest are the newest key set the node verified; 0
	// before the first.
	Version uint64 `json:"version"`
	Digest  string `json:"digest,omitempty"`
	// Keys are that set's keys (hex); at version 0 the node's anchor:
	// its own image's release key, or none for an unsigned image (which
	// takes the chain's genesis on first use).
	Keys []string `json:"keys,omitempty"`
}

// AnchorTrust is the trust of a node that has verified no chain yet:
// its image's release key (nil: unsigned image).
func AnchorTrust(imageKey []byte) Trust {
	if imageKey == nil {
		return Trust{}
	}
	return Trust{Keys: []string{hex.EncodeToString(imageKey)}}
}

// ChainRefusal is why Follow refuses a chain.
type ChainRefusal int

const (
	// ChainEmpty: the cluster has no release keys.
	ChainEmpty ChainRefusal = iota + 1
	// ChainMalformed: a statement is not a key set, or the versions do
	// not run 1, 2, 3, ... in order.
	ChainMalformed
	// ChainBrokenLink: a version's previous is not the digest of the
	// version before.
	ChainBrokenLink
	// ChainUnsigned: no key of the version before signed a version, or
	// a key it adds did not (for the genesis: a key it names).
	ChainUnsigned
	// ChainStale: the chain ends before the version the node trusts: an
	// old chain replayed.
	ChainStale
	// ChainForked: the chain's statement at the node's version is not
	// the one the node verified.
	ChainForked
	// ChainForeign: no version names the node's image key and is signed
	// by it: the keys do not descend from the key that signed this node.
	ChainForeign
)

// ChainError is Follow's refusal; an ErrRefused.
type ChainError struct {
	Refusal ChainRefusal
	// Version is the statement refused (1-based; 0: the chain as a
	// whole), Trusted the version the node trusts.
	Version, Trusted uint64
	Detail           string
}

func (e *ChainError) Error() string {
	why := map[ChainRefusal]string{
		ChainEmpty:      "the cluster has no release keys: add the first with plinthctl cluster policy --add-release-key",
		ChainMalformed:  "a statement is not a release key set in order",
		ChainBrokenLink: "a key set does not name the one before it",
		ChainUnsigned:   "a key set is not signed by a key of the set before it and by every key it adds",
		ChainStale:      "the chain ends before the key set this node already verified: an old chain replayed",
		ChainForked:     "the chain's key set at the version this node verified is another one",
		ChainForeign:    "no key set names this node's image release key and is signed by it",
	}[e.Refusal]
	s := "release keys refused: " + why
	if e.Version > 0 {
		s += fmt.Sprintf(" (version %d", e.Version)
		if e.Trusted > 0 {
			s += fmt.Sprintf(", this node trusts version %d", e.Trusted)
		}
		s += ")"
	}
	if e.Detail != "" {
		s += ": " + e.Detail
	}
	return s
}

func (e *ChainError) Unwrap() error { return ErrRefused }

// Follow verifies chain from t: it returns the newest key set's keys
// and the trust to keep from now on, or a *ChainError (t still holds).
func (t Trust) Follow(chain []Signed) ([][]byte, Trust, error) {
	if len(chain) == 0 {
		return nil, t, &ChainError{Refusal: ChainEmpty}
	}
	sets := make([][][]byte, len(chain))
	for i, s := range chain {
		ks, keys, err := parseKeySet(s.Body)
		if err == nil && ks.Version != uint64(i+1) {
			err = fmt.Errorf("version %d at place %d", ks.Version, i+1)
		}
		if err != nil {
			return nil, t, &ChainError{Refusal: ChainMalformed, Version: uint64(i + 1), Detail: err.Error()}
		}
		if i > 0 && ks.Previous != chain[i-1].Digest() {
			return nil, t, &ChainError{Refusal: ChainBrokenLink, Version: ks.Version}
		}
		sets[i] = keys
	}
	start, err := t.start(chain, sets)
	if err != nil {
		return nil, t, err
	}
	for j := start + 1; j < len(chain); j++ {
		if !chain[j].signedByAny(sets[j-1]) {
			return nil, t, &ChainError{Refusal: ChainUnsigned, Version: uint64(j + 1), Trusted: t.Version, Detail: "no key of the set before signed it"}
		}
		if k := unsignedNewKey(chain[j], sets[j], sets[j-1]); k != nil {
			return nil, t, &ChainError{Refusal: ChainUnsigned, Version: uint64(j + 1), Trusted: t.Version, Detail: "the key it adds, " + hex.EncodeToString(k) + ", did not sign it"}
		}
	}
	last := len(chain) - 1
	next := Trust{Version: uint64(last + 1), Digest: chain[last].Digest()}
	for _, k := range sets[last] {
		next.Keys = append(next.Keys, hex.EncodeToString(k))
	}
	return sets[last], next, nil
}

// start is the index of the statement the node trusts as it is, from
// which Follow checks every later link.
func (t Trust) start(chain []Signed, sets [][][]byte) (int, error) {
	switch {
	case t.Version > 0:
		if uint64(len(chain)) < t.Version {
			return 0, &ChainError{Refusal: ChainStale, Version: uint64(len(chain)), Trusted: t.Version}
		}
		if chain[t.Version-1].Digest() != t.Digest {
			return 0, &ChainError{Refusal: ChainForked, Version: t.Version, Trusted: t.Version}
		}
		return int(t.Version - 1), nil
	case len(t.Keys) > 0:
		anchors, err := decodeKeys(t.Keys)
		if err != nil {
			return 0, &ChainError{Refusal: ChainForeign, Detail: err.Error()}
		}
		for i, s := range chain {
			for _, a := range anchors {
				if slices.ContainsFunc(sets[i], func(k []byte) bool { return bytes.Equal(k, a) }) && s.SignedBy(a) {
					return i, nil
				}
			}
		}
		return 0, &ChainError{Refusal: ChainForeign, Detail: "image key " + t.Keys[0]}
	}
	// An unsigned image takes the genesis on first use; its keys all
	// signed it.
	if k := unsignedNewKey(chain[0], sets[0], nil); k != nil {
		return 0, &ChainError{Refusal: ChainUnsigned, Version: 1, Detail: "the genesis is not signed by its key " + hex.EncodeToString(k)}
	}
	return 0, nil
}

// unsignedNewKey is a key of set, not in prev, that did not sign s.
func unsignedNewKey(s Signed, set, prev [][]byte) []byte {
	for _, k := range set {
		if !slices.ContainsFunc(prev, func(p []byte) bool { return bytes.Equal(p, k) }) && !s.SignedBy(k) {
			return k
		}
	}
	return nil
}

// CheckNext checks that next extends chain by one version, as the
// curator does before it stores it (the nodes check again): the whole
// chain verifies from its genesis. It returns next's keys.
func CheckNext(chain []Signed, next Signed) ([][]byte, error) {
	keys, _, err := Trust{}.Follow(append(slices.Clone(chain), next))
	return keys, err
}

// CheckDowngrade reports why s does not allow release on a node whose
// release keys are keys, at now ("" if it does).
func CheckDowngrade(s *Signed, keys [][]byte, release uint64, now time.Time) string {
	if s == nil {
		return "no downgrade statement came with it"
	}
	var d Downgrade
	if err := json.Unmarshal(s.Body, &d); err != nil || d.Kind != KindDowngrade {
		return "the downgrade statement is not one"
	}
	switch {
	case !s.signedByAny(keys):
		return "the downgrade statement is not signed by any of the cluster's release keys"
	case d.Release != release:
		return fmt.Sprintf("the downgrade statement allows release %d, not %d", d.Release, release)
	case now.Unix() >= d.Expires:
		return fmt.Sprintf("the downgrade statement expired at %s", time.Unix(d.Expires, 0).UTC().Format(time.RFC3339))
	case time.Unix(d.Expires, 0).Sub(now) > MaxDowngradeValidity:
		return fmt.Sprintf("the downgrade statement is valid until %s, more than %v ahead", time.Unix(d.Expires, 0).UTC().Format(time.RFC3339), MaxDowngradeValidity)
	}
	return ""
}
