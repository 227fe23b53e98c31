package main

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/netip"
	"os"
	"strconv"
	"strings"
	"time"

	"golang.org/x/sys/unix"

	"plinth.dev/plinth/api/clusterpb"
	"plinth.dev/plinth/api/nodepb"
	"plinth.dev/plinth/platform/blockdev"
	"plinth.dev/plinth/platform/bootdisk"
	"plinth.dev/plinth/platform/kmod"
	"plinth.dev/plinth/platform/layout"
	"plinth.dev/plinth/platform/measure"
	"plinth.dev/plinth/platform/network"
	datadisk "plinth.dev/plinth/platform/storage"
	"plinth.dev/plinth/platform/tpm"
	"plinth.dev/plinth/platform/update"
	"plinth.dev/plinth/platform/verity"
	"plinth.dev/plinth/roleserver/localstorage"
	"plinth.dev/plinth/roleserver/parameters"
)

// The boot steps between the system image and the supervisor: parameters,
// TPM, data disk, local storage. Each returns a line for the console.

// espMount is where the boot disk's ESP is mounted (layout.ESPMount).
const espMount = layout.ESPMount

// readParameters reads the node parameters from fw_cfg, the boot disk's
// ESP (if the node booted from a disk) or the command line, in that order.
func readParameters(args map[string]string, boot *bootdisk.Boot) (*parameters.Loaded, string, error) {
	src := parameters.Sources{Cmdline: args}
	if boot != nil {
		if err := os.MkdirAll(espMount, 0o700); err != nil {
			return nil, "", err
		}
		if err := unix.Mount(boot.ESPDevice(), espMount, "vfat", unix.MS_RDONLY|unix.MS_NOSUID|unix.MS_NODEV|unix.MS_NOEXEC, ""); err != nil {
			return nil, "", fmt.Errorf("mounting the boot disk's ESP %s: %w", boot.ESPDevice(), err)
		}
		defer unix.Unmount(espMount, 0)
		src.ESPDir = espMount
	}
	p, err := parameters.Read(src)
	if err != nil {
		return nil, "", err
	}
	parameters.Defaults(p.Params)
	kind := "bootstrap a new cluster"
	if p.Params.GetRegister() != nil {
		kind = "register with a cluster"
	}
	return p, fmt.Sprintf("from %s (%d bytes, sha256 %x): %s, TPM %s, storage %s/%s", p.Source, len(p.Raw), p.SHA256[:8],
		kind, p.Params.GetTpm().GetPolicy(), p.Params.GetStorage().GetSecurity(), p.Params.GetStorage().GetFilesystem()), nil
}

// measureBoot opens the TPM, measures the parameters and system image
// into PCR 15 and returns the node's key protector. fw is what the
// firmware measured: on an unmeasured boot the protector creates no new
// sealed key unless the parameters allow it (existing keys still open).
func measureBoot(l *slog.Logger, p *parameters.Loaded, system verity.Params, fw measure.Firmware, upd *update.Node) (*tpm.TPM, datadisk.KeyProtector, string, error) {
	if gap := fw.Gap(); gap != "" {
		l.Warn("unmeasured boot: " + gap)
	}
	if p.Params.GetTpm().GetPolicy() == nodepb.NodeTPM_TPM_POLICY_DISABLED_FOR_DEVELOPMENT {
		l.Warn("TPM disabled for development by the node parameters: the data disk key is NOT protected; never use this for a real node")
		return nil, measure.InsecureKeys{}, "no TPM used", nil
	}
	chip, err := tpm.Open()
	if errors.Is(err, tpm.ErrNoTPM) {
		return nil, nil, "", errors.New("the node parameters require a TPM and this machine has none (for development only, set the TPM policy to disabled)")
	}
	if err != nil {
		return nil, nil, "", err
	}
	if err := measure.Boot(chip, p.SHA256, system.RootHash); err != nil {
		return nil, nil, "", err
	}
	var pcrs []int
	for _, n := range p.Params.GetTpm().GetSealPcrs() {
		pcrs = append(pcrs, int(n))
	}
	if len(pcrs) == 0 {
		pcrs = measure.DefaultSealPCRs
	}
	// Read now, before Lock: keys sealed later this boot must still
	// unseal at the next one.
	v, err := chip.ReadPCRs(pcrs)
	if err != nil {
		return nil, nil, "", err
	}
	// While an update is pending, keys seal to the other slot's PCRs too.
	keys := measure.TPMKeys{TPM: chip, PCRs: pcrs, Expected: v, Other: upd.Other}
	upd.SealPCRs, upd.Current, upd.ParametersDigest = pcrs, v, p.SHA256
	firmware := "firmware measured the UKI"
	if !fw.Measured() {
		firmware = "unmeasured boot, new keys allowed by tpm.allow_unmeasured_boot"
		if !p.Params.GetTpm().GetAllowUnmeasuredBoot() {
			keys.Unmeasured = fw.Gap()
			firmware = "unmeasured boot: existing keys open, no new key is sealed"
		}
	}
	return chip, keys, fmt.Sprintf("%s: parameters and system image measured, PCR %d = %x…, keys sealed to PCRs %v; %s",
		chip.Name(), measure.PCR, v[measure.PCR][:8], pcrs, firmware), nil
}

// openDataDisk chooses the data disk — once per boot: enrolment's Peek,
// UpdateEnrolment and Open get this choice in the returned Config.Disk —
// and opens it, unless the node registers: its volume key needs the
// cluster unlock key, so enrolment opens the volume once the network is up.
func openDataDisk(l *slog.Logger, p *parameters.Loaded, keys datadisk.KeyProtector, chip *tpm.TPM, root *localstorage.Root, registering bool) (datadisk.Config, *datadisk.Result, string, error) {
	cfg, err := dataDiskConfig(l, p, keys, root)
	if err != nil {
		return cfg, nil, "", err
	}
	disk, err := datadisk.FindDataDisk(context.Background(), p.Params.GetStorage().GetDataDisk(), l)
	if err != nil {
		return cfg, nil, "", err
	}
	cfg.Disk = disk.Path
	if registering {
		return cfg, nil, disk.String() + "; opening deferred: this node's volume key needs the cluster unlock key, which enrolment fetches once the network is up", nil
	}
	r, err := datadisk.Open(context.Background(), cfg)
	if err != nil {
		return cfg, nil, "", err
	}
	detail, err := volumeOpened(l, chip, root, r)
	return cfg, r, detail, err
}

// dataDiskConfig places the local storage tree and says how to open the
// data volume.
func dataDiskConfig(l *slog.Logger, p *parameters.Loaded, keys datadisk.KeyProtector, root *localstorage.Root) (datadisk.Config, error) {
	if err := localstorage.Place(root, "/"); err != nil {
		return datadisk.Config{}, err
	}
	mode := datadisk.ModeCrypt
	if p.Params.GetStorage().GetSecurity() == nodepb.StorageSecurity_STORAGE_SECURITY_AUTHENTICATED {
		mode = datadisk.ModeAuthenticated
	}
	fs := "ext4"
	if p.Params.GetStorage().GetFilesystem() == nodepb.NodeStorage_FILESYSTEM_XFS {
		fs = "xfs"
		// ext4 is built into the kernel; XFS is a module in the system image.
		if err := kmod.LoadByName(moduleDir(), "xfs"); err != nil {
			return datadisk.Config{}, err
		}
	}
	return datadisk.Config{Mode: mode, Filesystem: fs, MountPoint: root.Data.Path(), Keys: keys, Log: l}, nil
}

// volumeOpened finishes what opening the data volume starts: the local
// storage tree on it, no further unsealing this boot, the boot counter.
func volumeOpened(l *slog.Logger, chip *tpm.TPM, root *localstorage.Root, r *datadisk.Result) (string, error) {
	if err := localstorage.Create(&root.Data, 0o700); err != nil {
		return "", err
	}
	if err := localstorage.Create(&root.Ephemeral, 0o755); err != nil {
		return "", err
	}
	what := "unlocked"
	if r.Initialised {
		what = "initialised"
	}
	detail := fmt.Sprintf("%s %s: partition %s → %s (%.1f GiB) mounted at %s", what, r.Disk, r.Partition, r.Mapped,
		float64(r.Size)/(1<<30), root.Data.Path())
	l.Info("data volume open", "detail", detail)
	if chip == nil {
		l.Info("sealed keys: no TPM in use")
	} else if err := measure.Lock(chip); err != nil {
		return "", err
	} else {
		l.Info("sealed keys locked", "detail", fmt.Sprintf("PCR %d extended: no second unseal this boot", measure.PCR))
	}
	if _, err := countBoot(l, root); err != nil {
		return "", err
	}
	return detail, nil
}

func tpmUsage(chip *tpm.TPM) clusterpb.NodeTPMUsage {
	if chip == nil {
		return clusterpb.NodeTPMUsage_NODE_TPM_USAGE_NOT_USED_BY_POLICY
	}
	return clusterpb.NodeTPMUsage_NODE_TPM_USAGE_USED
}

// bootTime is when the kernel started, from /proc/uptime.
func bootTime() time.Time {
	b, err := os.ReadFile("/proc/uptime")
	if err != nil {
		return time.Now()
	}
	var up float64
	if _, err := fmt.Sscanf(string(b), "%f", &up); err != nil {
		return time.Now()
	}
	return time.Now().Add(-time.Duration(up * float64(time.Second)))
}

// mounted reports whether something is mounted at path.
func mounted(path string) bool {
	b, err := os.ReadFile("/proc/self/mountinfo")
	if err != nil {
		return true
	}
	for _, line := range strings.Split(string(b), "\n") {
		if f := strings.Fields(line); len(f) > 4 && f[4] == path {
			return true
		}
	}
	return false
}

// countBoot increments the persistent boot counter in /data.
func countBoot(l *slog.Logger, root *localstorage.Root) (string, error) {
	f := &root.Data.Node.BootCount
	n := 0
	switch b, err := f.Read(); {
	case err == nil:
		if n, err = strconv.Atoi(strings.TrimSpace(string(b))); err != nil {
			return "", fmt.Errorf("%s is corrupt (%q): %w", f.Path(), b, err)
		}
	case !os.IsNotExist(err):
		return "", err
	}
	n++
	if err := f.Write([]byte(strconv.Itoa(n)+"\n"), 0o600); err != nil {
		return "", err
	}
	l.Info("boot counter", "count", n)
	return f.Path(), nil
}

// benchmarkStorage runs only when the kernel command line asks for it
// (plinth.bench=storage, set by `make bench`): it measures dm-crypt
// against the raw disk on a second disk, which the benchmark provides as
// scratch space, and never on the data disk.
func benchmarkStorage(l *slog.Logger, dataDisk string) {
	disks, err := blockdev.Disks()
	var scratch string
	for _, d := range disks {
		if d.Path != dataDisk && scratch == "" {
			scratch = d.Path
		}
	}
	if err != nil || scratch == "" || dataDisk == "" {
		l.Error("storage benchmark needs a second (scratch) disk besides the data disk", "err", err)
		return
	}
	const size = 128 << 20
	r, err := datadisk.BenchmarkCrypt(scratch, size)
	if err != nil {
		l.Error("storage benchmark", "err", err)
		return
	}
	l.Info("storage benchmark", "disk", scratch, "bytes", size,
		"raw_write_mbps", fmt.Sprintf("%.1f", r.Raw.WriteMBps), "raw_read_mbps", fmt.Sprintf("%.1f", r.Raw.ReadMBps),
		"crypt_write_mbps", fmt.Sprintf("%.1f", r.Crypt.WriteMBps), "crypt_read_mbps", fmt.Sprintf("%.1f", r.Crypt.ReadMBps))
}

// networkConfig turns the parameters' network section into the network
// service's configuration: DHCP unless a static address is given.
func networkConfig(p *parameters.Loaded) (network.Config, error) {
	c := network.Config{ResolvConfPath: "/run/resolv.conf", HostnamePath: "/run/hostname", Hostname: p.Params.GetNetwork().GetHostname()}
	st := p.Params.GetNetwork().GetStatic()
	if st == nil {
		return c, nil
	}
	addr, err := netip.ParsePrefix(st.GetAddress())
	if err != nil {
		return c, err
	}
	s := &network.Static{Interface: st.GetInterface(), Address: addr}
	if st.GetGateway() != "" {
		if s.Gateway, err = netip.ParseAddr(st.GetGateway()); err != nil {
			return c, err
		}
	}
	for _, d := range st.GetDns() {
		a, err := netip.ParseAddr(d)
		if err != nil {
			return c, err
		}
		s.DNS = append(s.DNS, a)
	}
	c.Static = s
	return c, nil
}
