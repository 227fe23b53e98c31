package owner

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"plinth.dev/plinth/api/clusterpb"
)

// updateChunk is the size of one UpdateData message (gRPC's default
// limit is 4 MiB).
const updateChunk = 1 << 20

// Files of an image directory an update reads (image.ManifestFile,
// image.SignatureFile: this package does not link the builder).
const (
	manifestFile  = "manifest.json"
	signatureFile = "manifest.sig"
)

// UpdateImage is what an update sends from an image directory (the
// builder's output): its manifest and the manifest's signature, read
// once.
type UpdateImage struct {
	Dir      string
	Manifest []byte
	// Signature is manifest.sig (nil: the image is unsigned; it is sent
	// as it is and the node refuses it, by its cluster's policy).
	Signature []byte
	// Board and Version are the manifest's, Release its release number.
	Board, Version string
	Release        uint64
	// Downgrade is a downgrade statement signed by a release key: with
	// it the node installs the image although its release is older than
	// the one the node runs (set by the caller, not read from Dir).
	Downgrade *clusterpb.SignedStatement
	artefacts map[string]struct {
		Size int64 `json:"size"`
	}
}

// ReadUpdateImage reads the manifest of image directory dir and its
// signature, if there is one. Nothing is checked here: the node decides,
// against its cluster's release keys, so that the owner's tool cannot
// be the one that lets an image through.
func ReadUpdateImage(dir string) (*UpdateImage, error) {
	b, err := os.ReadFile(filepath.Join(dir, manifestFile))
	if err != nil {
		return nil, fmt.Errorf("%s is not an image directory: %w", dir, err)
	}
	img := &UpdateImage{Dir: dir, Manifest: b}
	var m struct {
		Board     string `json:"board"`
		Version   string `json:"version"`
		Release   uint64 `json:"release"`
		Artefacts map[string]struct {
			Size int64 `json:"size"`
		} `json:"artefacts"`
	}
	if err := json.Unmarshal(b, &m); err != nil {
		return nil, fmt.Errorf("%s: %w", filepath.Join(dir, manifestFile), err)
	}
	img.Board, img.Version, img.Release, img.artefacts = m.Board, m.Version, m.Release, m.Artefacts
	sig, err := os.ReadFile(filepath.Join(dir, signatureFile))
	switch {
	case err == nil:
		img.Signature = sig
	case !errors.Is(err, os.ErrNotExist):
		return nil, err
	}
	return img, nil
}

// RefusedError is a node's refusal of an image (InvalidArgument from
// NodeManagement.Update): not for its board, not signed by one of the
// cluster's release keys, older than what it runs, or not matching its
// manifest. The node wrote nothing it would boot. Err is the node's
// status error.
type RefusedError struct {
	Node, Version string
	Err           error
}

func (e *RefusedError) Error() string {
	return fmt.Sprintf("node %s refused the image of version %s: %s", e.Node, e.Version, status.Convert(e.Err).Message())
}

func (e *RefusedError) Unwrap() error { return e.Err }

// refused is err as a RefusedError when the node refused the image.
func refused(id string, img *UpdateImage, err error) error {
	if status.Code(err) == codes.InvalidArgument {
		return &RefusedError{Node: id, Version: img.Version, Err: err}
	}
	return err
}

// UpdateProgress is called with what the node reports while it installs
// (sent bytes are reported as phase "sending NAME").
type UpdateProgress func(*clusterpb.UpdateProgress)

// UpdateMode is what a node does with an update once it is installed.
type UpdateMode int

const (
	// UpdateReboot: reboot into it once now.
	UpdateReboot UpdateMode = iota
	// UpdateNextBoot: boot it once at the node's next reboot.
	UpdateNextBoot
	// UpdateStage: keep it staged until ActivateUpdate (or CancelUpdate).
	UpdateStage
)

// Update installs img on node id (NodeManagement.Update) and returns the
// node's final answer; mode says what the node does with it then. A
// refusal of the image is a *RefusedError.
func (c *Client) Update(ctx context.Context, id string, img *UpdateImage, mode UpdateMode, progress UpdateProgress) (*clusterpb.UpdateDone, error) {
	done, err := c.update(ctx, id, img, mode, progress)
	return done, refused(id, img, err)
}

func (c *Client) update(ctx context.Context, id string, img *UpdateImage, mode UpdateMode, progress UpdateProgress) (*clusterpb.UpdateDone, error) {
	if progress == nil {
		progress = func(*clusterpb.UpdateProgress) {}
	}
	cc, err := c.nodeConn(ctx, id)
	if err != nil {
		return nil, err
	}
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	stream, err := clusterpb.NewNodeManagementClient(cc).Update(ctx)
	if err != nil {
		return nil, err
	}
	start := &clusterpb.UpdateStart{Manifest: img.Manifest, ManifestSignature: img.Signature, Downgrade: img.Downgrade,
		Reboot: mode == UpdateReboot, Stage: mode == UpdateStage}
	if err := stream.Send(&clusterpb.UpdateRequest{Kind: &clusterpb.UpdateRequest_Start{Start: start}}); err != nil {
		return nil, recvError(stream, err)
	}
	first, err := stream.Recv()
	if err != nil {
		return nil, err
	}
	acc := first.GetAccepted()
	if acc == nil {
		return nil, errors.New("the node did not accept the update")
	}
	// The node's answers while the artefacts go out.
	answers := make(chan error, 1)
	var done *clusterpb.UpdateDone
	go func() {
		for {
			r, err := stream.Recv()
			if err != nil {
				answers <- err
				return
			}
			if p := r.GetProgress(); p != nil {
				progress(p)
			}
			if d := r.GetDone(); d != nil {
				done = d
			}
		}
	}()
	if err := sendArtefacts(stream, img, acc.GetArtefacts(), progress); err != nil {
		cancel()
		if aerr := <-answers; aerr != io.EOF && aerr != nil {
			return nil, aerr
		}
		return nil, err
	}
	if err := <-answers; err != io.EOF {
		return nil, err
	}
	if done == nil {
		return nil, errors.New("the node ended the update without an answer")
	}
	return done, nil
}

// ActivateUpdate makes node id boot its staged update of version (any if
// empty) once: now with reboot, else at its next reboot.
func (c *Client) ActivateUpdate(ctx context.Context, id, version string, reboot bool) (*clusterpb.UpdateDone, error) {
	cc, err := c.nodeConn(ctx, id)
	if err != nil {
		return nil, err
	}
	return clusterpb.NewNodeManagementClient(cc).ActivateUpdate(ctx, &clusterpb.ActivateUpdateRequest{Version: version, Reboot: reboot})
}

// CancelUpdate abandons node id's installed, not yet booted update of
// version (any if empty).
func (c *Client) CancelUpdate(ctx context.Context, id, version string) (*clusterpb.CancelUpdateResponse, error) {
	cc, err := c.nodeConn(ctx, id)
	if err != nil {
		return nil, err
	}
	return clusterpb.NewNodeManagementClient(cc).CancelUpdate(ctx, &clusterpb.CancelUpdateRequest{Version: version})
}

type updateSender interface {
	Send(*clusterpb.UpdateRequest) error
	CloseSend() error
}

func sendArtefacts(stream updateSender, img *UpdateImage, names []string, progress UpdateProgress) error {
	buf := make([]byte, updateChunk)
	for _, name := range names {
		a, ok := img.artefacts[name]
		if !ok {
			return fmt.Errorf("the node asks for %s, which the manifest does not list", name)
		}
		f, err := os.Open(filepath.Join(img.Dir, name))
		if err != nil {
			return err
		}
		var sent int64
		for {
			n, rerr := f.Read(buf)
			if n > 0 {
				if err := stream.Send(&clusterpb.UpdateRequest{Kind: &clusterpb.UpdateRequest_Data{Data: &clusterpb.UpdateData{Data: buf[:n]}}}); err != nil {
					f.Close()
					return err
				}
				sent += int64(n)
				progress(&clusterpb.UpdateProgress{Phase: "sending " + name, DoneBytes: sent, TotalBytes: a.Size})
			}
			if rerr == io.EOF {
				break
			}
			if rerr != nil {
				f.Close()
				return rerr
			}
		}
		f.Close()
		if sent != a.Size {
			return fmt.Errorf("%s is %d bytes, the manifest says %d", name, sent, a.Size)
		}
	}
	return stream.CloseSend()
}

// recvError returns the node's error after a failed Send (gRPC reports
// the status on Recv).
func recvError(stream interface {
	Recv() (*clusterpb.UpdateResponse, error)
}, sendErr error) error {
	if _, err := stream.Recv(); err != nil && err != io.EOF {
		return err
	}
	return sendErr
}
