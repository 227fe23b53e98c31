package parameters

import (
	"bytes"
	"crypto/sha256"
	"encoding/base64"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"google.golang.org/protobuf/proto"

	"plinth.dev/plinth/api/nodepb"
	"plinth.dev/plinth/platform/cmdline"
)

// fakeSources lays out temp directories the way the node sees them:
// FwCfgDir/by_name/opt/plinth/parameters/raw and ESPDir/plinth/parameters.pb.
// A nil argument leaves that source absent.
type fakeSources struct {
	t     *testing.T
	fwCfg string
	esp   string
}

func newFake(t *testing.T) *fakeSources {
	return &fakeSources{t: t, fwCfg: t.TempDir(), esp: t.TempDir()}
}

func (f *fakeSources) putFwCfg(raw []byte) {
	f.put(filepath.Join(f.fwCfg, "by_name", "opt", "plinth", "parameters", "raw"), raw)
}

func (f *fakeSources) putESP(raw []byte) {
	f.put(filepath.Join(f.esp, "plinth", "parameters.pb"), raw)
}

func (f *fakeSources) put(path string, raw []byte) {
	f.t.Helper()
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		f.t.Fatal(err)
	}
	if err := os.WriteFile(path, raw, 0o644); err != nil {
		f.t.Fatal(err)
	}
}

func (f *fakeSources) sources(cmd map[string]string) Sources {
	return Sources{FwCfgDir: f.fwCfg, ESPDir: f.esp, Cmdline: cmd}
}

// docNamed is a valid document told apart from others by its hostname, so
// that a test can see which source Read took.
func docNamed(t *testing.T, host string) []byte {
	p := bootstrapDoc()
	p.Network.Hostname = host
	b, err := Encode(p)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

func TestFwCfgPath(t *testing.T) {
	if got, want := FwCfgPath(""), "/sys/firmware/qemu_fw_cfg/by_name/opt/plinth/parameters/raw"; got != want {
		t.Errorf("FwCfgPath(\"\") = %q, want %q", got, want)
	}
}

func TestReadPrecedence(t *testing.T) {
	for _, tc := range []struct {
		name               string
		fw, esp, cmd       bool
		wantSrc            Source
		wantHost           string
		espDirUnconfigured bool
	}{
		{name: "all three", fw: true, esp: true, cmd: true, wantSrc: SourceFwCfg, wantHost: "from-fwcfg"},
		{name: "fw_cfg only", fw: true, wantSrc: SourceFwCfg, wantHost: "from-fwcfg"},
		{name: "esp and cmdline", esp: true, cmd: true, wantSrc: SourceESP, wantHost: "from-esp"},
		{name: "fw_cfg and cmdline", fw: true, cmd: true, wantSrc: SourceFwCfg, wantHost: "from-fwcfg"},
		{name: "esp only", esp: true, wantSrc: SourceESP, wantHost: "from-esp"},
		{name: "cmdline only", cmd: true, wantSrc: SourceCmdline, wantHost: "from-cmdline"},
		{name: "no ESP configured", esp: true, cmd: true, espDirUnconfigured: true, wantSrc: SourceCmdline, wantHost: "from-cmdline"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			f := newFake(t)
			cmd := map[string]string{"console": "ttyS0"}
			if tc.fw {
				f.putFwCfg(docNamed(t, "from-fwcfg"))
			}
			if tc.esp {
				f.putESP(docNamed(t, "from-esp"))
			}
			if tc.cmd {
				cmd[CmdlineKey] = CmdlineValue(docNamed(t, "from-cmdline"))
			}
			s := f.sources(cmd)
			if tc.espDirUnconfigured {
				s.ESPDir = ""
			}
			l, err := Read(s)
			if err != nil {
				t.Fatal(err)
			}
			if l.Source != tc.wantSrc || l.Params.GetNetwork().GetHostname() != tc.wantHost {
				t.Errorf("got source %s host %q, want %s %q", l.Source, l.Params.GetNetwork().GetHostname(), tc.wantSrc, tc.wantHost)
			}
			if !bytes.Equal(l.Raw, docNamed(t, tc.wantHost)) {
				t.Error("Raw is not the bytes of the chosen source")
			}
			if l.SHA256 != sha256.Sum256(l.Raw) {
				t.Error("SHA256 is not the hash of Raw")
			}
		})
	}
}

// A source that is present but broken stops Read, even when a later source
// has a good document.
func TestReadInvalidDoesNotFallThrough(t *testing.T) {
	good := docNamed(t, "good")
	invalid := mustMarshal(t, &nodepb.Parameters{Network: &nodepb.Network{Hostname: "x"}}) // valid protobuf, no cluster
	for _, tc := range []struct {
		name    string
		setup   func(f *fakeSources, cmd map[string]string)
		wantSrc Source
		wantErr string
	}{
		{"fw_cfg garbage", func(f *fakeSources, cmd map[string]string) {
			f.putFwCfg([]byte("\xff\xff\xff garbage"))
			f.putESP(good)
			cmd[CmdlineKey] = CmdlineValue(good)
		}, SourceFwCfg, "not a plinth.node.v1.Parameters protobuf"},
		{"fw_cfg empty", func(f *fakeSources, cmd map[string]string) {
			f.putFwCfg(nil)
			f.putESP(good)
		}, SourceFwCfg, "document is empty"},
		{"fw_cfg unreadable", func(f *fakeSources, cmd map[string]string) {
			// A directory where the file should be: open works, read fails.
			if err := os.MkdirAll(FwCfgPath(f.fwCfg), 0o755); err != nil {
				t.Fatal(err)
			}
			f.putESP(good)
		}, SourceFwCfg, "is a directory"},
		{"esp invalid", func(f *fakeSources, cmd map[string]string) {
			f.putESP(invalid)
			cmd[CmdlineKey] = CmdlineValue(good)
		}, SourceESP, "neither bootstrap nor register"},
		{"esp too large", func(f *fakeSources, cmd map[string]string) {
			f.putESP(make([]byte, MaxSize+1))
			cmd[CmdlineKey] = CmdlineValue(good)
		}, SourceESP, "larger than"},
		{"cmdline not base64", func(f *fakeSources, cmd map[string]string) {
			cmd[CmdlineKey] = "not*base64"
		}, SourceCmdline, "not unpadded base64url"},
		{"cmdline standard base64", func(f *fakeSources, cmd map[string]string) {
			cmd[CmdlineKey] = base64.StdEncoding.EncodeToString([]byte{0xfb, 0xff})
		}, SourceCmdline, "not unpadded base64url"},
		{"cmdline bare flag", func(f *fakeSources, cmd map[string]string) {
			cmd[CmdlineKey] = ""
		}, SourceCmdline, "empty value"},
		{"cmdline invalid document", func(f *fakeSources, cmd map[string]string) {
			cmd[CmdlineKey] = CmdlineValue(invalid)
		}, SourceCmdline, "neither bootstrap nor register"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			f := newFake(t)
			cmd := map[string]string{}
			tc.setup(f, cmd)
			l, err := Read(f.sources(cmd))
			if err == nil {
				t.Fatalf("Read succeeded from %s", l.Source)
			}
			var se *SourceError
			if !errors.As(err, &se) || se.Source != tc.wantSrc {
				t.Fatalf("error %v, want a SourceError from %s", err, tc.wantSrc)
			}
			if errors.Is(err, ErrNotFound) {
				t.Error("a broken document must not look like a missing one")
			}
			if !strings.Contains(err.Error(), tc.wantErr) || !strings.Contains(err.Error(), string(tc.wantSrc)) {
				t.Errorf("error %q does not mention %q and the source", err, tc.wantErr)
			}
		})
	}
}

func TestReadNotFound(t *testing.T) {
	f := newFake(t)
	// The fw_cfg directory exists with other items, as under QEMU without
	// -fw_cfg for Plinth; the ESP is mounted but has no file.
	f.put(filepath.Join(f.fwCfg, "by_name", "etc", "boot-fail-wait", "raw"), []byte{0})
	for name, s := range map[string]Sources{
		"empty dirs":          f.sources(map[string]string{"console": "ttyS0"}),
		"missing dirs":        {FwCfgDir: filepath.Join(f.fwCfg, "nope"), ESPDir: filepath.Join(f.esp, "nope")},
		"no ESP, nil cmdline": {FwCfgDir: f.fwCfg},
	} {
		t.Run(name, func(t *testing.T) {
			_, err := Read(s)
			if !errors.Is(err, ErrNotFound) {
				t.Fatalf("err = %v, want ErrNotFound", err)
			}
			if !strings.Contains(err.Error(), CmdlineKey) || !strings.Contains(err.Error(), "fw_cfg") {
				t.Errorf("error %q does not say where it looked", err)
			}
		})
	}
}

// The real command line parser hands Read what it needs, and padding from
// a hand-made value is tolerated.
func TestReadFromKernelCmdline(t *testing.T) {
	raw := docNamed(t, "cmdline-node")
	for _, v := range []string{CmdlineValue(raw), base64.URLEncoding.EncodeToString(raw)} {
		args := cmdline.Parse("console=ttyS0 panic=-1 " + CmdlineKey + "=" + v + " plinth.verity=abc\n")
		l, err := Read(Sources{FwCfgDir: t.TempDir(), Cmdline: args})
		if err != nil {
			t.Fatal(err)
		}
		if l.Source != SourceCmdline || !bytes.Equal(l.Raw, raw) || l.Params.GetNetwork().GetHostname() != "cmdline-node" {
			t.Errorf("got %s %q", l.Source, l.Params.GetNetwork().GetHostname())
		}
	}
}

func TestCmdlineValue(t *testing.T) {
	raw := []byte{0xfb, 0xff, 0xfe, 0x00}
	v := CmdlineValue(raw)
	if strings.ContainsAny(v, "=+/ \"") {
		t.Errorf("CmdlineValue %q has characters that need care on a command line", v)
	}
	if got, err := decodeCmdline(v); err != nil || !bytes.Equal(got, raw) {
		t.Errorf("decode(%q) = %x, %v", v, got, err)
	}
}

func TestEncodeRoundTrip(t *testing.T) {
	for name, p := range map[string]*nodepb.Parameters{
		"bootstrap":         bootstrapDoc(),
		"register":          registerDoc(t),
		"bootstrap minimal": {Cluster: &nodepb.Parameters_Bootstrap{Bootstrap: &nodepb.Bootstrap{OwnerPublicKey: ownerKey}}},
	} {
		t.Run(name, func(t *testing.T) {
			raw, err := Encode(p)
			if err != nil {
				t.Fatal(err)
			}
			again, err := Encode(proto.Clone(p).(*nodepb.Parameters))
			if err != nil || !bytes.Equal(raw, again) {
				t.Error("Encode is not deterministic")
			}
			got, err := Decode(raw)
			if err != nil {
				t.Fatal(err)
			}
			if !proto.Equal(got, p) {
				t.Errorf("round trip changed the document:\n got %v\nwant %v", got, p)
			}
			// And through the command line form.
			l, err := Read(Sources{FwCfgDir: t.TempDir(), Cmdline: map[string]string{CmdlineKey: CmdlineValue(raw)}})
			if err != nil || !proto.Equal(l.Params, p) {
				t.Errorf("cmdline round trip: %v", err)
			}
		})
	}
}

func TestEncodeRejectsInvalid(t *testing.T) {
	if _, err := Encode(&nodepb.Parameters{}); err == nil {
		t.Error("Encode accepted a document without bootstrap or register")
	}
	if _, err := Encode(nil); err == nil {
		t.Error("Encode accepted nil")
	}
}

func TestDecodeEmpty(t *testing.T) {
	if _, err := Decode(nil); err == nil || !strings.Contains(err.Error(), "empty") {
		t.Errorf("Decode(nil) = %v", err)
	}
}
