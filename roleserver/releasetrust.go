package roleserver

import (
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"sync"

	"plinth.dev/plinth/platform/layout"
	"plinth.dev/plinth/platform/releasekeys"
	"plinth.dev/plinth/roleserver/localstorage"
)

// The release keys a node installs images of are the newest key set of
// the cluster's chain, as this node verifies it (platform/releasekeys):
//
//	/data/node/release-trust  the version it verified last ─┐
//	none yet: its image's key (layout.ReleaseKeyPath) ──────┴► Trust.Follow(chain from the curator)
//	                                                            ─► keys; the newer Trust kept
//
// The curator forwards the chain and could forge or replay one: the node
// takes only what leads on from where it stands, and moves forward only.
// Update verifies at every install (nodemgmt_update.go), policyfetch at
// every policy it sees, so a replay of an older chain is refused even by
// a node that installs nothing meanwhile.

// releaseTrust is this node's place in the chain.
type releaseTrust struct {
	// file keeps it (nil: memory only, in tests).
	file *localstorage.File
	// imageKey is the running image's release key file ("":
	// layout.ReleaseKeyPath).
	imageKey string

	mu      sync.Mutex
	current *releasekeys.Trust
}

// load is the trust kept, or the image's anchor.
func (r *releaseTrust) load() (releasekeys.Trust, error) {
	if r.current != nil {
		return *r.current, nil
	}
	if r.file != nil {
		b, err := r.file.Read()
		if err == nil {
			var t releasekeys.Trust
			if err := json.Unmarshal(b, &t); err != nil {
				// /data is the node's own encrypted volume: a damaged
				// file is a fault, and the image's anchor the safe start.
				return releasekeys.Trust{}, fmt.Errorf("%s is damaged: %w", r.file.Path(), err)
			}
			return t, nil
		}
		if !errors.Is(err, fs.ErrNotExist) {
			return releasekeys.Trust{}, err
		}
	}
	path := r.imageKey
	if path == "" {
		path = layout.ReleaseKeyPath
	}
	k, err := releasekeys.ImageKey(path)
	if err != nil {
		return releasekeys.Trust{}, err
	}
	return releasekeys.AnchorTrust(k), nil
}

// follow verifies chain from where the node stands and returns the
// newest key set's keys, keeping the newer trust; a *ChainError if the
// chain does not lead on from there (the trust stays).
func (r *releaseTrust) follow(chain []releasekeys.Signed, log *slog.Logger) ([][]byte, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	t, err := r.load()
	if err != nil {
		return nil, err
	}
	keys, next, err := t.Follow(chain)
	if err != nil {
		return nil, err
	}
	if next.Version != t.Version || next.Digest != t.Digest {
		if r.file != nil {
			b, _ := json.Marshal(next)
			if err := r.file.Write(b, 0o600); err != nil {
				return nil, fmt.Errorf("keeping the release key set: %w", err)
			}
		}
		if log != nil {
			log.Info("release keys: verified the cluster's key set", "version", next.Version, "keys", len(keys), "was", t.Version)
		}
	}
	r.current = &next
	return keys, nil
}
