// Package parameters finds, decodes and checks the node parameters document
// (plinth.node.v1.Parameters, Go package nodepb) that tells a node on first
// boot whether to bootstrap a cluster or register with one.
//
// The document is looked for in three places, in this order, and the first
// one that holds a document wins:
//
//	fw_cfg   FwCfgDir/by_name/opt/plinth/parameters/raw   (QEMU -fw_cfg name=opt/plinth/parameters,file=...)
//	esp      ESPDir/plinth/parameters.pb                   (file on the EFI system partition)
//	cmdline  plinth.parameters=BASE64URL                   (kernel command line, unpadded)
//
// A source that is present but unreadable or invalid is an error naming that
// source; Read never falls through to a later source in that case, because
// the operator meant the broken document and booting with a different one
// (say, a stale ESP file) could make the node join the wrong cluster. No
// document at all is ErrNotFound. Either way the caller stops and reports;
// nothing here ever decides to wipe a disk.
package parameters

import (
	"crypto/sha256"
	"encoding/base64"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"strings"

	"google.golang.org/protobuf/proto"

	"plinth.dev/plinth/api/nodepb"
)

const (
	// FwCfgName is the QEMU fw_cfg item name, as given to -fw_cfg name=.
	FwCfgName = "opt/plinth/parameters"
	// CmdlineKey is the kernel command line key; its value is CmdlineValue.
	CmdlineKey = "plinth.parameters"
	// ESPPath is the document's path relative to the ESP's root.
	ESPPath = "plinth/parameters.pb"
	// DefaultFwCfgDir is where the qemu_fw_cfg module exposes fw_cfg.
	DefaultFwCfgDir = "/sys/firmware/qemu_fw_cfg"
	// MaxSize bounds a document. A real one is well under 4 KiB (a CA
	// certificate is the largest part); the bound keeps a corrupt source
	// from making /init read an unbounded file into memory.
	MaxSize = 64 << 10
)

// Source names where a document came from.
type Source string

const (
	SourceFwCfg   Source = "fw_cfg"
	SourceESP     Source = "esp"
	SourceCmdline Source = "cmdline"
)

// Sources says where to look. The zero value looks only in fw_cfg at its
// usual place: no ESP and an empty command line.
type Sources struct {
	// FwCfgDir is the qemu_fw_cfg sysfs directory; "" means DefaultFwCfgDir.
	// A missing directory (no QEMU, or the module not loaded) means the
	// source is absent.
	FwCfgDir string
	// ESPDir is where the ESP is mounted; "" means there is no ESP to look at.
	ESPDir string
	// Cmdline is the parsed kernel command line (platform/cmdline.Parse).
	Cmdline map[string]string
}

// Loaded is a decoded and validated document and where it came from.
type Loaded struct {
	// Params is the document exactly as decoded: Defaults has not been
	// applied, so that callers can still tell "unset" from an explicit
	// choice. Call Defaults on it before acting on it.
	Params *nodepb.Parameters
	Source Source
	// Raw is the binary protobuf as found (after base64 decoding for the
	// command line).
	Raw []byte
	// SHA256 is the hash of Raw, which /init measures into a PCR so that
	// keys sealed to it are only released to a node booted with the same
	// document.
	SHA256 [32]byte
}

// ErrNotFound means no source holds a document. The error Read returns wraps
// it with the places it looked.
var ErrNotFound = errors.New("no node parameters found")

// SourceError is a document that was found but could not be read, decoded
// or validated.
type SourceError struct {
	Source Source
	// Where is the file path, or the command line key.
	Where string
	Err   error
}

func (e *SourceError) Error() string {
	return fmt.Sprintf("node parameters from %s (%s): %v", e.Source, e.Where, e.Err)
}

func (e *SourceError) Unwrap() error { return e.Err }

// FwCfgPath is the file that holds the fw_cfg item's contents under dir
// ("" means DefaultFwCfgDir).
func FwCfgPath(dir string) string {
	if dir == "" {
		dir = DefaultFwCfgDir
	}
	return filepath.Join(dir, "by_name", filepath.FromSlash(FwCfgName), "raw")
}

// Read returns the document from the first source that has one.
func Read(s Sources) (*Loaded, error) {
	fwPath := FwCfgPath(s.FwCfgDir)
	raw, ok, err := readFile(fwPath)
	if err != nil || ok {
		return load(SourceFwCfg, fwPath, raw, err)
	}

	espPath := "(no ESP)"
	if s.ESPDir != "" {
		espPath = filepath.Join(s.ESPDir, filepath.FromSlash(ESPPath))
		raw, ok, err := readFile(espPath)
		if err != nil || ok {
			return load(SourceESP, espPath, raw, err)
		}
	}

	if v, ok := s.Cmdline[CmdlineKey]; ok {
		raw, err := decodeCmdline(v)
		return load(SourceCmdline, CmdlineKey, raw, err)
	}
	return nil, fmt.Errorf("%w: looked at fw_cfg %s, ESP %s and kernel argument %s=", ErrNotFound, fwPath, espPath, CmdlineKey)
}

// load finishes Read for the chosen source: every failure from here on
// names the source.
func load(src Source, where string, raw []byte, err error) (*Loaded, error) {
	if err != nil {
		return nil, &SourceError{src, where, err}
	}
	p, err := Decode(raw)
	if err != nil {
		return nil, &SourceError{src, where, err}
	}
	return &Loaded{Params: p, Source: src, Raw: raw, SHA256: sha256.Sum256(raw)}, nil
}

// readFile reads at most MaxSize bytes of path. A missing file (or missing
// parent directory) is not an error but ok=false: that is how an absent
// source looks. Any other failure, such as a permission error, is an error,
// since a document might be there.
func readFile(path string) (raw []byte, ok bool, err error) {
	f, err := os.Open(path)
	if errors.Is(err, fs.ErrNotExist) {
		return nil, false, nil
	}
	if err != nil {
		return nil, false, err
	}
	defer f.Close()
	// sysfs files report a size that need not match their contents, so read
	// to EOF rather than trusting Stat.
	raw, err = io.ReadAll(io.LimitReader(f, MaxSize+1))
	if err != nil {
		return nil, false, err
	}
	if len(raw) > MaxSize {
		return nil, false, fmt.Errorf("larger than %d bytes", MaxSize)
	}
	return raw, true, nil
}

func decodeCmdline(v string) ([]byte, error) {
	if v == "" {
		return nil, errors.New("empty value")
	}
	// Padding is not part of the format, but a hand-made argument from
	// `base64 -w0 | tr` often has it and there is no ambiguity in ignoring it.
	raw, err := base64.RawURLEncoding.DecodeString(strings.TrimRight(v, "="))
	if err != nil {
		return nil, fmt.Errorf("not unpadded base64url: %w", err)
	}
	if len(raw) > MaxSize {
		return nil, fmt.Errorf("larger than %d bytes", MaxSize)
	}
	return raw, nil
}

// Decode parses a binary document and validates it.
func Decode(raw []byte) (*nodepb.Parameters, error) {
	if len(raw) == 0 {
		// An empty message is valid protobuf, but an empty file is far
		// more likely a failed copy than a document; say so.
		return nil, errors.New("document is empty")
	}
	p := &nodepb.Parameters{}
	if err := proto.Unmarshal(raw, p); err != nil {
		return nil, fmt.Errorf("not a plinth.node.v1.Parameters protobuf: %w", err)
	}
	if err := Validate(p); err != nil {
		return nil, err
	}
	return p, nil
}

// Encode validates p and marshals it deterministically, so that the same
// document always yields the same bytes and hence the same PCR measurement.
// It refuses an invalid document so that tools cannot produce one a node
// would reject at boot.
func Encode(p *nodepb.Parameters) ([]byte, error) {
	if err := Validate(p); err != nil {
		return nil, err
	}
	return proto.MarshalOptions{Deterministic: true}.Marshal(p)
}

// CmdlineValue is raw as the value of the kernel argument CmdlineKey:
// base64url without padding, which needs no quoting on a command line.
func CmdlineValue(raw []byte) string {
	return base64.RawURLEncoding.EncodeToString(raw)
}
