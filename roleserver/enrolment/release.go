package enrolment

import (
	"plinth.dev/plinth/platform/layout"
	"plinth.dev/plinth/platform/releasekeys"
)

// bootstrapReleaseKeys is the chain of release keys a new cluster starts
// with: the genesis this node's image carries (layout.ReleaseGenesisPath:
// the key that signed the image, signed by it), or none for an unsigned
// image (the owner adds the first key, signed by itself, with plinthctl
// cluster policy --add-release-key before any node can be updated). Why the
// image's key: whoever built and flashed the image that founds the
// cluster decides what it runs anyway, and the next image they sign
// with the same key then updates it without a step in between. source
// says which it was, for the log.
func (c *Config) bootstrapReleaseKeys() (chain []releasekeys.Signed, keys [][]byte, source string, err error) {
	keyPath, genesisPath := c.releaseKeyFile, c.releaseGenesisFile
	if keyPath == "" {
		keyPath, genesisPath = layout.ReleaseKeyPath, layout.ReleaseGenesisPath
	}
	k, err := releasekeys.ImageKey(keyPath)
	if err != nil || k == nil {
		return nil, nil, "none (unsigned image)", err
	}
	g, err := releasekeys.ImageGenesis(genesisPath, k)
	if err != nil {
		// The system image is verity-checked: a bad genesis is the
		// builder's fault, and a cluster founded without it would
		// refuse every update.
		return nil, nil, "", err
	}
	return []releasekeys.Signed{g}, [][]byte{k}, "this node's image (" + genesisPath + ")", nil
}
