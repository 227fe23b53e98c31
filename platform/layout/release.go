package layout

// ReleaseKeyPath is where the system image carries the ed25519 public key
// of the release key that signed it (plinthctl build --sign-key): 64 hex
// digits and a newline, the manifest's "release_key". The builder writes
// it; a node takes the cluster's chain of release keys only if it leads
// from this key (platform/update.AnchorTrust). An unsigned image has
// none.
const ReleaseKeyPath = "/etc/plinth/release.pub"

// ReleaseGenesisPath is where a signed system image carries the first
// key set of a cluster it founds: {version 1, keys: [its release key]},
// signed by that key (platform/update.Genesis, JSON), so that the owner
// who built the image can update the cluster with the next image signed
// by the same key. An unsigned image has none.
const ReleaseGenesisPath = "/etc/plinth/release-genesis.json"

// OSReleasePath is the running system image's os-release. Besides the
// usual fields it carries PLINTH_BOARD and PLINTH_RELEASE: the image's
// release number, which an update may not go below (a missing
// PLINTH_RELEASE is release 0).
const OSReleasePath = "/etc/os-release"
