package update

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"time"

	"plinth.dev/plinth/platform/layout"
	"plinth.dev/plinth/platform/sysimage"
	"plinth.dev/plinth/platform/verity"
)

// Manifest is what an update reads of the builder's manifest.json
// (image.Manifest; /init does not link the builder).
type Manifest struct {
	Board   string `json:"board"`
	Version string `json:"version"`
	// Release orders images (CheckRelease); 0: unreleased.
	Release uint64 `json:"release"`
	Verity  struct {
		RootHash       string `json:"root_hash"`
		Salt           string `json:"salt"`
		DataBlocks     uint64 `json:"data_blocks"`
		HashStartBlock uint64 `json:"hash_start_block"`
	} `json:"verity"`
	Artefacts map[string]struct {
		SHA256 string `json:"sha256"`
		Size   int64  `json:"size"`
	} `json:"artefacts"`
}

// Artefact names in an image directory (image.SystemFile, image.UKISlotFile).
const systemArtefact = "system.img"

func ukiArtefact(slot string) string { return "plinth-" + slot + ".efi" }

// maxUKI bounds the UKI an update accepts (the ESP holds three).
const maxUKI = 40 << 20

// Progress is what an update reports while it works.
type Progress struct {
	Phase       string
	Done, Total int64
}

// Session is one update, from an accepted manifest to the slot ready to
// boot. Begin starts it; Close ends it.
type Session struct {
	n    *Node
	m    Manifest
	slot string
	sys  artefactInfo
	uki  artefactInfo
	dev  string // the slot's partition
	size int64  // its size
	// have: the slot already holds the system image (verity.HoldsTree):
	// only the UKI is sent, and the slot is read back as always.
	have bool
}

type artefactInfo struct {
	name string
	sum  []byte
	size int64
}

// Begin checks a manifest against this node and reserves the update:
// one at a time, none while another waits for its trial boot or is on
// trial. The manifest must be signed by one of the cluster's release
// keys and not be older than the running release (CheckRelease): its
// signature is checked before anything else of it is believed.
func (n *Node) Begin(req Request) (*Session, error) {
	if n.Boot == nil || n.Running == "" {
		return nil, ErrNoSlots
	}
	manifest := req.Manifest
	running, err := n.runningRelease()
	if err != nil {
		return nil, err
	}
	release, err := CheckRelease(manifest, req.Signature, req.ReleaseKeys, running.Release, req.Downgrade, time.Now())
	if err != nil {
		return nil, err
	}
	var m Manifest
	if err := json.Unmarshal(manifest, &m); err != nil {
		return nil, fmt.Errorf("%w: manifest: %v", ErrRejected, err)
	}
	if m.Board != n.Board {
		return nil, fmt.Errorf("%w: the image is for board %q, this node is %q", ErrRejected, m.Board, n.Board)
	}
	if m.Version == "" {
		return nil, fmt.Errorf("%w: the manifest names no version", ErrRejected)
	}
	s := &Session{n: n, m: m, slot: Other(n.Running)}
	if s.sys, err = m.artefact(systemArtefact); err != nil {
		return nil, err
	}
	if s.uki, err = m.artefact(ukiArtefact(s.slot)); err != nil {
		return nil, err
	}
	if s.uki.size > maxUKI {
		return nil, fmt.Errorf("%w: %s is %d bytes, at most %d", ErrRejected, s.uki.name, s.uki.size, maxUKI)
	}
	dev, part, err := n.Boot.Slot(s.slot)
	if err != nil {
		return nil, fmt.Errorf("%w: %v", ErrNoSlots, err)
	}
	s.dev, s.size = dev, part.Size()
	if s.sys.size > s.size {
		return nil, fmt.Errorf("%w: the system image is %d bytes, slot %s holds %d", ErrRejected, s.sys.size, s.slot, s.size)
	}
	if p, err := m.verityParams(); err == nil {
		if f, err := os.Open(dev); err == nil {
			s.have = verity.HoldsTree(f, p)
			f.Close()
		}
	}
	n.mu.Lock()
	defer n.mu.Unlock()
	if n.busy {
		return nil, fmt.Errorf("%w: an update is being installed", ErrBusy)
	}
	if p := n.state.Pending; p != nil {
		if n.boot == BootTrial {
			return nil, fmt.Errorf("%w: this boot is the trial of version %s; it becomes permanent once the node is healthy", ErrBusy, p.Version)
		}
		if p.Phase == PhaseStaged {
			return nil, fmt.Errorf("%w: version %s is staged in slot %s: activate or cancel it first", ErrBusy, p.Version, p.To)
		}
		return nil, fmt.Errorf("%w: version %s is installed in slot %s and boots at the next reboot (cancel it first)", ErrBusy, p.Version, p.To)
	}
	if n.boot == BootTrial {
		return nil, fmt.Errorf("%w: this boot is still on trial", ErrBusy)
	}
	n.busy = true
	if release < running.Release {
		n.Log.Warn("installing an older release: the owner allowed the downgrade",
			"release", release, "version", m.Version, "running_release", running.Release, "running_version", running.Version)
	}
	return s, nil
}

// runningRelease reads the running image's os-release (Node.OSRelease).
// Without one the node runs release 0: nothing it could install is older.
func (n *Node) runningRelease() (OSRelease, error) {
	path := n.OSRelease
	if path == "" {
		path = layout.OSReleasePath
	}
	data, err := os.ReadFile(path)
	if errors.Is(err, os.ErrNotExist) {
		return OSRelease{}, nil
	}
	if err != nil {
		return OSRelease{}, fmt.Errorf("update: the running image's release: %w", err)
	}
	return ParseOSRelease(data)
}

func (m *Manifest) artefact(name string) (artefactInfo, error) {
	a, ok := m.Artefacts[name]
	if !ok {
		return artefactInfo{}, fmt.Errorf("%w: the manifest lists no %s", ErrRejected, name)
	}
	sum, err := hex.DecodeString(a.SHA256)
	if err != nil || len(sum) != sha256.Size || a.Size <= 0 {
		return artefactInfo{}, fmt.Errorf("%w: the manifest's entry for %s is malformed", ErrRejected, name)
	}
	return artefactInfo{name: name, sum: sum, size: a.Size}, nil
}

// Slot is the slot the session writes.
func (s *Session) Slot() string { return s.slot }

// Version is the version it installs.
func (s *Session) Version() string { return s.m.Version }

// Artefacts are what Install reads, in order: the system image and the
// slot's UKI, or the UKI alone when the slot holds the system image
// already (a retried update, or going back to the version the slot had).
func (s *Session) Artefacts() []string {
	if s.have {
		return []string{s.uki.name}
	}
	return []string{s.sys.name, s.uki.name}
}

func (m *Manifest) verityParams() (verity.Params, error) {
	root, err := hex.DecodeString(m.Verity.RootHash)
	if err != nil {
		return verity.Params{}, err
	}
	salt, err := hex.DecodeString(m.Verity.Salt)
	if err != nil {
		return verity.Params{}, err
	}
	return verity.Params{DataBlocks: m.Verity.DataBlocks, HashStartBlock: m.Verity.HashStartBlock, Salt: salt, RootHash: root}, nil
}

// Close ends the session; another update may begin.
func (s *Session) Close() { s.n.release() }

// Install reads the system image and the slot's UKI from r, in that
// order, writes and checks them and seals the node's keys to the new
// slot's predicted PCRs as well: the update is staged, and Activate sets
// the firmware to boot it once. On error the update is abandoned: the new
// slot cannot be booted, the keys are sealed as before, and the failure
// is in the state.
func (s *Session) Install(ctx context.Context, r io.Reader, progress func(Progress)) (err error) {
	n := s.n
	prev := n.currentState()
	pending := &Pending{Phase: PhaseWriting, From: n.Running, To: s.slot, Version: s.m.Version, Started: time.Now().Unix()}
	if err := n.setState(State{Pending: pending, LastFailed: prev.LastFailed, LastVersion: prev.LastVersion}); err != nil {
		return fmt.Errorf("recording the update: %w", err)
	}
	resealed := false
	defer func() {
		if err == nil {
			return
		}
		// Abandon: nothing may boot the slot, the keys drop its PCRs.
		e := Entries{Store: n.Store, ESP: n.Boot.ESP}
		if cerr := e.CancelBootOnce(s.slot); cerr != nil {
			n.Log.Error("update abandoned: clearing BootNext", "err", cerr)
		}
		failed := State{LastFailed: &Failure{Version: s.m.Version, Slot: s.slot, Reason: err.Error(), Time: time.Now().Unix()}, LastVersion: prev.LastVersion}
		if werr := n.setState(failed); werr != nil {
			n.Log.Error("update abandoned: recording it", "err", werr)
		}
		if resealed && n.Reseal != nil {
			if rerr := n.Reseal(); rerr != nil {
				n.Log.Error("update abandoned: sealing the keys to this slot alone", "err", rerr)
			}
		}
	}()
	if progress == nil {
		progress = func(Progress) {}
	}
	if s.have {
		progress(Progress{Phase: "slot " + s.slot + " holds this system image already: not sent, read back below"})
	} else if err := s.writeSystem(ctx, r, progress); err != nil {
		return err
	}
	progress(Progress{Phase: "receiving " + s.uki.name, Total: s.uki.size})
	img := make([]byte, s.uki.size)
	if _, err := io.ReadFull(r, img); err != nil {
		return fmt.Errorf("%w: the stream ended inside %s: %v", ErrRejected, s.uki.name, err)
	}
	if sum := sha256.Sum256(img); !bytes.Equal(sum[:], s.uki.sum) {
		return fmt.Errorf("%w: %s does not match the manifest's sha256", ErrRejected, s.uki.name)
	}
	if k, err := r.Read(make([]byte, 1)); k > 0 || (err != nil && err != io.EOF) {
		return fmt.Errorf("%w: the stream holds more than the manifest's artefacts", ErrRejected)
	}
	u, err := ReadUKI(img)
	if err != nil {
		return fmt.Errorf("%w: %s: %v", ErrRejected, s.uki.name, err)
	}
	if mp, err := s.m.verityParams(); err != nil || u.Verity.String() != mp.String() || u.Slot != s.slot {
		return fmt.Errorf("%w: %s boots system image %x from slot %q, the manifest's is %s in slot %s", ErrRejected, s.uki.name, u.Verity.RootHash, u.Slot, s.m.Verity.RootHash, s.slot)
	}

	progress(Progress{Phase: "verifying slot " + s.slot + " against its root hash", Total: s.sys.size})
	if err := s.verifySlot(ctx, u); err != nil {
		return err
	}
	progress(Progress{Phase: "writing " + layout.ESPSlotUKI(s.slot), Total: s.uki.size})
	if err := n.withESP(func(dir string) error { return writeFileAtomic(filepath.Join(dir, layout.ESPSlotUKI(s.slot)), img) }); err != nil {
		return fmt.Errorf("writing the UKI to the ESP: %w", err)
	}

	progress(Progress{Phase: "sealing the keys to slot " + s.slot + "'s predicted PCRs as well"})
	predicted, err := Predict(u, n.Events, n.ParametersDigest, n.Current, n.SealPCRs)
	if err != nil {
		return fmt.Errorf("predicting slot %s's PCRs: %w", s.slot, err)
	}
	if n.Reseal != nil {
		if err := n.keepPCRs(pending, map[string]map[int][]byte{n.Running: n.Current, s.slot: predicted}); err != nil {
			return fmt.Errorf("keeping slot %s's PCR values: %w", s.slot, err)
		}
		resealed = true
		if err := n.Reseal(); err != nil {
			return fmt.Errorf("sealing the keys: %w", err)
		}
	}
	staged := *pending
	staged.Phase = PhaseStaged
	if err := n.setState(State{Pending: &staged, LastFailed: prev.LastFailed, LastVersion: prev.LastVersion}); err != nil {
		return err
	}
	n.Log.Info("update staged: Activate boots it once", "version", s.m.Version, "slot", s.slot)
	return nil
}

// writeSystem copies the system image from r into the slot, hashing it.
func (s *Session) writeSystem(ctx context.Context, r io.Reader, progress func(Progress)) error {
	f, err := os.OpenFile(s.dev, os.O_WRONLY, 0)
	if err != nil {
		return err
	}
	defer f.Close()
	h := sha256.New()
	buf := make([]byte, 1<<20)
	var done int64
	last := time.Now()
	for done < s.sys.size {
		if err := ctx.Err(); err != nil {
			return err
		}
		k, rerr := io.ReadFull(r, buf[:min(int64(len(buf)), s.sys.size-done)])
		if k > 0 {
			h.Write(buf[:k])
			if _, err := f.WriteAt(buf[:k], done); err != nil {
				return fmt.Errorf("writing slot %s: %w", s.slot, err)
			}
			done += int64(k)
		}
		if rerr != nil {
			return fmt.Errorf("%w: the stream ended after %d of the system image's %d bytes: %v", ErrRejected, done, s.sys.size, rerr)
		}
		if time.Since(last) > time.Second || done == s.sys.size {
			progress(Progress{Phase: "writing the system image to slot " + s.slot, Done: done, Total: s.sys.size})
			last = time.Now()
		}
	}
	if !bytes.Equal(h.Sum(nil), s.sys.sum) {
		return fmt.Errorf("%w: the system image does not match the manifest's sha256", ErrRejected)
	}
	return f.Sync()
}

// verifySlot reads the written slot through dm-verity with the UKI's root
// hash: what the trial boot will mount, checked block by block now.
func (s *Session) verifySlot(ctx context.Context, u *UKI) error {
	r, err := sysimage.OpenNamed("system-"+s.slot, s.dev, u.Verity)
	if err != nil {
		return fmt.Errorf("%w: slot %s: %v", ErrRejected, s.slot, err)
	}
	defer r.Close()
	if _, err := sysimage.Verify(ctx, r.Device, r.Size, sysimage.Pace{Busy: 1}); err != nil {
		if errors.Is(err, sysimage.ErrTampered) {
			return fmt.Errorf("%w: slot %s as written does not match the UKI's root hash: %v", ErrRejected, s.slot, err)
		}
		return err
	}
	return nil
}
