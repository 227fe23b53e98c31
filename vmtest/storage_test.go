//go:build built

package vmtest

import (
	"bytes"
	"context"
	"io"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"plinth.dev/plinth/api/nodepb"
	"plinth.dev/plinth/launch"
)

// Storage tests: every node here has a 1 GiB disk file and (unless said
// otherwise) a persistent swtpm state, so reboots see the same machine.

const testDiskSize = 1 << 30

type machine struct {
	img    *launch.Image
	dir    string
	disk   string
	tpm    string
	params string
}

func newMachine(t *testing.T, p *nodepb.Parameters) *machine {
	t.Helper()
	return newMachineIn(t, testDir(t), p)
}

// newMachineIn keeps the machine's disk, TPM and logs in dir (tests with
// several machines give each its own).
func newMachineIn(t *testing.T, dir string, p *nodepb.Parameters) *machine {
	t.Helper()
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	m := &machine{img: testImage(t), dir: dir}
	m.disk = filepath.Join(m.dir, "disk.img")
	m.tpm = filepath.Join(m.dir, "tpm")
	if err := os.MkdirAll(m.tpm, 0o755); err != nil {
		t.Fatal(err)
	}
	m.setParams(t, p)
	return m
}

func (m *machine) setParams(t *testing.T, p *nodepb.Parameters) {
	t.Helper()
	var err error
	if m.params, err = launch.WriteParameters(filepath.Join(m.dir, "parameters.pb"), p); err != nil {
		t.Fatal(err)
	}
}

// boot starts the machine; each boot's console goes to its own directory.
func (m *machine) boot(t *testing.T, ctx context.Context, name string, mutate ...func(*launch.NodeOptions)) *launch.Node {
	t.Helper()
	o := m.img.NodeOptions(name).WithParameters(m.params)
	o.WorkDir = filepath.Join(m.dir, name)
	o.DiskPath, o.DiskSizeBytes = m.disk, testDiskSize
	o.TPMStateDir = m.tpm
	for _, f := range mutate {
		f(&o)
	}
	if err := os.MkdirAll(o.WorkDir, 0o755); err != nil {
		t.Fatal(err)
	}
	return launchT(t, ctx, o)
}

func powerOff(t *testing.T, ctx context.Context, n *launch.Node) {
	t.Helper()
	// A button press before anyone listens is lost, as on real hardware.
	if _, err := n.WaitForLine(ctx, regexp.MustCompile(`listening for the power button`)); err != nil {
		t.Fatal(err)
	}
	if err := n.PowerDown(ctx); err != nil {
		t.Fatal(err)
	}
	if err := n.Wait(ctx); err != nil {
		t.Fatalf("qemu did not end cleanly: %v", err)
	}
}

// wantBootCount waits for the node's boot counter and fails unless it is want.
func wantBootCount(t *testing.T, ctx context.Context, n *launch.Node, want string) {
	t.Helper()
	if got := mustLine(t, ctx, n, `I init: boot counter count=(\d+)`)[1]; got != want {
		t.Fatalf("boot count %s, want %s", got, want)
	}
}

func hashFile(t *testing.T, p string) [32]byte {
	t.Helper()
	st, err := os.Stat(p)
	if err != nil {
		t.Fatal(err)
	}
	return hashRange(t, p, 0, st.Size())
}

func assertNoLine(t *testing.T, n *launch.Node, re string) {
	t.Helper()
	r := regexp.MustCompile(re)
	for _, l := range n.Lines() {
		if r.MatchString(l) {
			t.Errorf("unexpected console line: %s", l)
		}
	}
}

// TestDataDiskLifecycle: first boot sets the disk up (count 1), a reboot
// continues (count 2); changed parameters or another TPM are refused
// without a byte of the disk changing; restored parameters continue.
func TestDataDiskLifecycle(t *testing.T) {
	parallel(t, 49*time.Second) // single-machine tests run two at a time: see the package doc
	ctx, cancel := context.WithTimeout(context.Background(), 4*bootTimeout)
	defer cancel()
	params := launch.BootstrapParameters()
	m := newMachine(t, params)

	n := m.boot(t, ctx, "boot1")
	mustLine(t, ctx, n, `I init: storage: make ext4 filesystem`)
	mustLine(t, ctx, n, `I init: storage: mark setup complete`)
	// Made with project quotas, the local volumes' size limits.
	mustLine(t, ctx, n, `mounted at /data, project quota on`)
	wantBootCount(t, ctx, n, "1")
	mustLine(t, ctx, n, `I init: node ready`)
	powerOff(t, ctx, n)
	mustLine(t, ctx, n, `I init: data volume unmounted`)

	n = m.boot(t, ctx, "boot2")
	mustLine(t, ctx, n, `I init: storage: unseal node unlock key`)
	mustLine(t, ctx, n, `unlocked .* mounted at /data, project quota on`)
	wantBootCount(t, ctx, n, "2")
	assertNoLine(t, n, `make ext4 filesystem`)
	powerOff(t, ctx, n)

	before := hashFile(t, m.disk)

	// Different parameters (a hostname): PCR 15 differs, the key stays sealed.
	changed := launch.BootstrapParameters()
	changed.Cluster = params.Cluster
	changed.Network = &nodepb.Network{Hostname: "renamed"}
	m.setParams(t, changed)
	n = m.boot(t, ctx, "boot3-changed-params")
	t.Logf("refused as expected: %s", mustLine(t, ctx, n, `E init: boot step failed: open data disk err=.*refusing to touch the data disk: cannot unseal.*PCR 15.*`)[0])
	mustLine(t, ctx, n, `E init: node halted`)
	powerOff(t, ctx, n)
	if hashFile(t, m.disk) != before {
		t.Fatal("the disk changed although its key could not be unsealed")
	}

	// The same disk in another machine (another TPM).
	m.setParams(t, params)
	n = m.boot(t, ctx, "boot4-other-tpm", func(o *launch.NodeOptions) { o.TPMStateDir = filepath.Join(m.dir, "other-tpm") })
	t.Logf("refused as expected: %s", mustLine(t, ctx, n, `E init: boot step failed: open data disk err=.*refusing to touch the data disk: cannot unseal.*`)[0])
	powerOff(t, ctx, n)
	if hashFile(t, m.disk) != before {
		t.Fatal("the disk changed in a machine with another TPM")
	}

	// Parameters restored: the node continues where it was.
	n = m.boot(t, ctx, "boot5-restored")
	wantBootCount(t, ctx, n, "3")
	powerOff(t, ctx, n)
}

// TestUnmeasuredBootSealsNoNewKey: a direct kernel boot (SeaBIOS, QEMU
// -kernel) is unmeasured; with the TPM required and no
// tpm.allow_unmeasured_boot the node says so and refuses to seal a key for
// its blank disk, which stays blank.
func TestUnmeasuredBootSealsNoNewKey(t *testing.T) {
	parallel(t, 12*time.Second) // single-machine tests run two at a time: see the package doc
	ctx, cancel := context.WithTimeout(context.Background(), bootTimeout)
	defer cancel()
	p := launch.BootstrapParameters()
	p.Tpm.AllowUnmeasuredBoot = false
	m := newMachine(t, p)
	n := m.boot(t, ctx, "boot1")
	mustLine(t, ctx, n, `W init: unmeasured boot: not booted by UEFI firmware`)
	mustLine(t, ctx, n, `E init: boot step failed: open data disk err=.*unmeasured boot.*allow_unmeasured_boot.*nothing was written`)
	powerOff(t, ctx, n)
	f, err := os.Open(m.disk)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	buf := make([]byte, 4<<20)
	if _, err := f.ReadAt(buf, 0); err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(buf, make([]byte, len(buf))) {
		t.Fatal("the blank disk was written although no key could be sealed")
	}
}

// TestGarbageParametersTouchNothing: undecodable parameters are a clear
// error and the (blank) disk stays blank.
func TestGarbageParametersTouchNothing(t *testing.T) {
	parallel(t, 8*time.Second) // single-machine tests run two at a time: see the package doc
	ctx, cancel := context.WithTimeout(context.Background(), bootTimeout)
	defer cancel()
	m := newMachine(t, launch.BootstrapParameters())
	if err := os.WriteFile(m.params, []byte("this is not a protobuf \xff\xff\xff"), 0o644); err != nil {
		t.Fatal(err)
	}
	n := m.boot(t, ctx, "boot")
	mustLine(t, ctx, n, `E init: boot step failed: read node parameters err=.*fw_cfg`)
	mustLine(t, ctx, n, `E init: node halted`)
	powerOff(t, ctx, n)
	if !diskZero(t, m.disk) {
		t.Fatal("the disk was written although the parameters were garbage")
	}
}

// TestPowerCutDuringSetup kills QEMU while the first-time setup runs; the
// next boot redoes the setup and the node comes up with boot count 1.
func TestPowerCutDuringSetup(t *testing.T) {
	parallel(t, 17*time.Second) // single-machine tests run two at a time: see the package doc
	ctx, cancel := context.WithTimeout(context.Background(), 2*bootTimeout)
	defer cancel()
	m := newMachine(t, launch.BootstrapParameters())
	n := m.boot(t, ctx, "boot1-cut")
	// The header is on disk (state: initialising) once the key is sealed.
	mustLine(t, ctx, n, `I init: storage: seal new node unlock key`)
	if err := n.Kill(); err != nil {
		t.Fatal(err)
	}
	n.Wait(ctx)

	n = m.boot(t, ctx, "boot2")
	mustLine(t, ctx, n, `W init: storage: an earlier first-time setup was interrupted`)
	mustLine(t, ctx, n, `I init: storage: mark setup complete`)
	wantBootCount(t, ctx, n, "1")
	powerOff(t, ctx, n)
}

func TestTPMPolicy(t *testing.T) {
	parallel(t, 18*time.Second) // single-machine tests run two at a time: see the package doc
	t.Run("DisabledForDevelopmentBootsWithoutTPM", func(t *testing.T) {
		ctx, cancel := context.WithTimeout(context.Background(), bootTimeout)
		defer cancel()
		p := launch.BootstrapParameters()
		p.Tpm = &nodepb.NodeTPM{Policy: nodepb.NodeTPM_TPM_POLICY_DISABLED_FOR_DEVELOPMENT}
		p.GetBootstrap().InitialPolicy = &nodepb.ClusterPolicy{AllowNodesWithoutTpm: true}
		m := newMachine(t, p)
		n := m.boot(t, ctx, "boot", func(o *launch.NodeOptions) { o.NoTPM = true })
		mustLine(t, ctx, n, `W init: TPM disabled for development`)
		wantBootCount(t, ctx, n, "1")
		powerOff(t, ctx, n)
	})
	t.Run("RequiredWithoutTPMRefuses", func(t *testing.T) {
		ctx, cancel := context.WithTimeout(context.Background(), bootTimeout)
		defer cancel()
		m := newMachine(t, launch.BootstrapParameters())
		n := m.boot(t, ctx, "boot", func(o *launch.NodeOptions) { o.NoTPM = true })
		line := mustLine(t, ctx, n, `E init: boot step failed: TPM and measured boot err=(.*)`)[1]
		if !strings.Contains(line, "require a TPM") {
			t.Errorf("refusal does not say why: %s", line)
		}
		powerOff(t, ctx, n)
		if !diskZero(t, m.disk) {
			t.Error("disk written without a TPM")
		}
	})
}

func diskZero(t *testing.T, p string) bool {
	t.Helper()
	f, err := os.Open(p)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	buf := make([]byte, 1<<20)
	for {
		n, err := f.Read(buf)
		for _, b := range buf[:n] {
			if b != 0 {
				return false
			}
		}
		if err == io.EOF {
			return true
		}
		if err != nil {
			t.Fatal(err)
		}
	}
}

// TestAuthenticatedStorage: dm-integrity (keyed HMAC per sector) under
// dm-crypt, set up on first boot and unlocked on the next.
func TestAuthenticatedStorage(t *testing.T) {
	parallel(t, 18*time.Second) // single-machine tests run two at a time: see the package doc
	ctx, cancel := context.WithTimeout(context.Background(), 2*bootTimeout)
	defer cancel()
	p := launch.BootstrapParameters()
	p.Storage.Security = nodepb.StorageSecurity_STORAGE_SECURITY_AUTHENTICATED
	m := newMachine(t, p)
	n := m.boot(t, ctx, "boot1")
	mustLine(t, ctx, n, `I init: storage: mark setup complete`)
	wantBootCount(t, ctx, n, "1")
	powerOff(t, ctx, n)
	n = m.boot(t, ctx, "boot2")
	mustLine(t, ctx, n, `I init: storage: disk was set up before mode=authenticated`)
	wantBootCount(t, ctx, n, "2")
	powerOff(t, ctx, n)
}

// TestXFSAndStaticNetwork: the parameters choose XFS for the data disk and
// a static address (slirp's network, so the address is reachable) with a
// hostname.
func TestXFSAndStaticNetwork(t *testing.T) {
	parallel(t, 16*time.Second) // single-machine tests run two at a time: see the package doc
	ctx, cancel := context.WithTimeout(context.Background(), bootTimeout)
	defer cancel()
	p := launch.BootstrapParameters()
	p.Storage.Filesystem = nodepb.NodeStorage_FILESYSTEM_XFS
	p.Network = &nodepb.Network{Hostname: "xfs-node", Static: &nodepb.StaticConfig{
		Address: "10.0.2.20/24", Gateway: "10.0.2.2", Dns: []string{"10.0.2.3"}}}
	m := newMachine(t, p)
	n := m.boot(t, ctx, "boot")
	mustLine(t, ctx, n, `I init: storage: make xfs filesystem`)
	mustLine(t, ctx, n, `mounted at /data, project quota on`)
	wantBootCount(t, ctx, n, "1")
	mustLine(t, ctx, n, `I root.network: configured address .*address=10\.0\.2\.20/24 .*source=static`)
	mustLine(t, ctx, n, `hostname=xfs-node`)
	mustLine(t, ctx, n, `I init: node ready`)
	powerOff(t, ctx, n)
}
