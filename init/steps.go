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
	"plinth.dev/plinth/platform/kmod"
	"plinth.dev/plinth/platform/layout"
	"plinth.dev/plinth/platform/measure"
	"plinth.dev/plinth/platform/network"
	datadisk "plinth.dev/plinth/platform/storage"
	"plinth.dev/plinth/platform/tpm"
	"plinth.dev/plinth/roleserver/localstorage"
	"plinth.dev/plinth/roleserver/parameters"
)

// The boot steps between the system image and the supervisor: parameters,
// TPM, data disk, local storage. Each returns a line for the console.

// espMount is where the boot disk's ESP is mounted (layout.ESPMount).
const espMount = layout.ESPMount

// readParameters reads the node parameters from fw_cfg, the boot disk's
// ESP (if the node booted from a disk) or the command line, in that order.
func (b *boot) readParameters() (string, error) {
	src := parameters.Sources{Cmdline: b.args}
	if disk := b.bootDisk; disk != nil {
		if err := os.MkdirAll(espMount, 0o700); err != nil {
			return "", err
		}
		if err := unix.Mount(disk.ESPDevice(), espMount, "vfat", unix.MS_RDONLY|unix.MS_NOSUID|unix.MS_NODEV|unix.MS_NOEXEC, ""); err != nil {
			return "", fmt.Errorf("mounting the boot disk's ESP %s: %w", disk.ESPDevice(), err)
		}
		defer unix.Unmount(espMount, 0)
		src.ESPDir = espMount
	}
	p, err := parameters.Read(src)
	if err != nil {
		return "", err
	}
	parameters.Defaults(p.Params)
	b.params, b.registering = p, p.Params.GetRegister() != nil
	kind := "bootstrap a new cluster"
	if p.Params.GetRegister() != nil {
		kind = "register with a cluster"
	}
	return fmt.Sprintf("from %s (%d bytes, sha256 %x): %s, TPM %s, storage %s/%s", p.Source, len(p.Raw), p.SHA256[:8],
		kind, p.Params.GetTpm().GetPolicy(), p.Params.GetStorage().GetSecurity(), p.Params.GetStorage().GetFilesystem()), nil
}

// measureBoot finds what the firmware measured, opens the TPM and
// measures the parameters and system image into it (openTPM), and tells
// the update side about the running slot (describeSlot). The live PCRs
// are checked against the UKI's predictions beside the boot.
func (b *boot) measureBoot() (string, error) {
	b.firmware, b.events = firmwareMeasurements()
	detail, err := b.openTPM()
	if err != nil {
		return "", err
	}
	go checkPredictions(b.l, b.chip, b.bootDisk, b.events)
	b.describeSlot()
	return detail, nil
}

// openTPM opens the TPM, measures the parameters and system image into
// PCR 15 and sets the node's key protector. b.firmware is what the
// firmware measured: on an unmeasured boot the protector creates no new
// sealed key unless the parameters allow it (existing keys still open).
func (b *boot) openTPM() (string, error) {
	p, fw := b.params, b.firmware
	if gap := fw.Gap(); gap != "" {
		b.l.Warn("unmeasured boot: " + gap)
	}
	if p.Params.GetTpm().GetPolicy() == nodepb.NodeTPM_TPM_POLICY_DISABLED_FOR_DEVELOPMENT {
		b.l.Warn("TPM disabled for development by the node parameters: the data disk key is NOT protected; never use this for a real node")
		b.keys = measure.InsecureKeys{}
		return "no TPM used", nil
	}
	chip, err := tpm.Open()
	if errors.Is(err, tpm.ErrNoTPM) {
		return "", errors.New("the node parameters require a TPM and this machine has none (for development only, set the TPM policy to disabled)")
	}
	if err != nil {
		return "", err
	}
	if err := measure.Boot(chip, p.SHA256, b.system.RootHash); err != nil {
		return "", err
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
		return "", err
	}
	// While an update is pending, keys seal to the other slot's PCRs too.
	keys := measure.TPMKeys{TPM: chip, PCRs: pcrs, Expected: v, Other: b.updates.Other}
	firmware := "firmware measured the UKI"
	if !fw.Measured() {
		firmware = "unmeasured boot, new keys allowed by tpm.allow_unmeasured_boot"
		if !p.Params.GetTpm().GetAllowUnmeasuredBoot() {
			keys.Unmeasured = fw.Gap()
			firmware = "unmeasured boot: existing keys open, no new key is sealed"
		}
	}
	b.chip, b.keys, b.sealed = chip, keys, sealedTo{pcrs: pcrs, current: v, parameters: p.SHA256}
	return fmt.Sprintf("%s: parameters and system image measured, PCR %d = %x…, keys sealed to PCRs %v; %s",
		chip.Name(), measure.PCR, v[measure.PCR][:8], pcrs, firmware), nil
}

// openDataDisk chooses the data disk — once per boot: enrolment's Peek,
// UpdateEnrolment and Open get this choice in b.disk.Disk — and opens it,
// unless the node registers: its volume key needs the cluster unlock key,
// so enrolment opens the volume once the network is up. An image built
// to stop before this step does so here (haltBeforeDataDisk).
func (b *boot) openDataDisk() (string, error) {
	if err := b.haltBeforeDataDisk(); err != nil {
		return "", err
	}
	cfg, err := dataDiskConfig(b.l, b.params, b.keys, b.local)
	if err != nil {
		return "", err
	}
	disk, err := datadisk.FindDataDisk(context.Background(), b.params.Params.GetStorage().GetDataDisk(), b.l)
	if err != nil {
		return "", err
	}
	cfg.Disk = disk.Path
	b.disk = cfg
	if b.registering {
		return disk.String() + "; opening deferred: this node's volume key needs the cluster unlock key, which enrolment fetches once the network is up", nil
	}
	r, err := datadisk.Open(context.Background(), cfg)
	if err != nil {
		return "", err
	}
	b.volume = r
	return volumeOpened(b.l, b.chip, b.local, r)
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
	quota := "project quota on"
	if !r.ProjectQuota {
		quota = "no project quota (a filesystem made before Plinth set it up)"
	}
	detail := fmt.Sprintf("%s %s: partition %s → %s (%.1f GiB) mounted at %s, %s", what, r.Disk, r.Partition, r.Mapped,
		float64(r.Size)/(1<<30), root.Data.Path(), quota)
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
