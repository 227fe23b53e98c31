package storage

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"

	"plinth.dev/plinth/platform/blockdev"
	"plinth.dev/plinth/platform/devicemapper"
	"plinth.dev/plinth/platform/gpt"
)

// KeyProtector keeps the node unlock key: the TPM (seal/unseal), or, for
// development only and never silently, nothing at all.
type KeyProtector interface {
	// Policy names the protection, recorded in the header ("tpm", "insecure-no-tpm").
	Policy() string
	Seal(key []byte) ([]byte, error)
	Unseal(blob []byte) ([]byte, error)
}

// sealChecker is a KeyProtector that can tell before setup writes
// anything that Seal would refuse (measure.TPMKeys on an unmeasured boot).
type sealChecker interface{ CanSeal() error }

// Config of the data disk.
type Config struct {
	// Disk is the whole-disk device, as FindDataDisk chose it. Required:
	// the disk is chosen once per boot and every call uses that choice.
	Disk       string
	Mode       Mode
	Filesystem string // "ext4" or "xfs"
	MountPoint string
	Keys       KeyProtector
	// ClusterUnlockKey is mixed into the volume key on nodes that
	// registered with a cluster (key policy "tpm+cluster"); nil on the
	// node that bootstrapped the cluster, whose volume must open on a
	// cold start with no cluster to ask.
	ClusterUnlockKey []byte
	// Enrolment is stored in the header at first-time setup (see
	// Header.Enrolment); ignored for a disk that is already set up.
	Enrolment []byte
	Log       *slog.Logger
}

// MappedName is the device-mapper name of the opened data volume.
const MappedName = "data"

// Result describes an opened data volume.
type Result struct {
	Disk, Partition, Mapped string
	// Initialised is true when this boot set the disk up.
	Initialised bool
	// Resumed is true when an interrupted first-time setup was redone.
	Resumed bool
	Steps   []Step
	Size    int64
	// ProjectQuota is true when the mounted filesystem accounts and
	// enforces project quotas, which local volumes' size limits need
	// (ext4 made before Plinth set its quota feature has none).
	ProjectQuota bool
	// nuk is the node unlock key, kept for ResealNodeKey: after /init
	// locks the TPM (measure.Lock) nothing this boot can unseal it again,
	// and an update must seal it to the new slot's PCRs too.
	nuk []byte
}

// Step is one timed storage step, for the console and benchmarks.
type Step struct {
	Name     string
	Duration time.Duration
}

// ErrRefused wraps every reason to leave a disk alone.
var ErrRefused = errors.New("refusing to touch the data disk")

type opener struct {
	Config
	res  *Result
	disk blockdev.Disk
	part gpt.Partition
	// flashed is the table of a flashed disk (readLayout), to which
	// partition adds the data partition.
	flashed *gpt.Table
}

func (o *opener) step(name string, fn func() error) error {
	t := time.Now()
	err := fn()
	d := time.Since(t)
	o.res.Steps = append(o.res.Steps, Step{name, d})
	if err != nil {
		return err
	}
	o.Log.Info("storage: "+name, "took", d.Round(time.Millisecond))
	return nil
}

// Open opens the data disk c.Disk (as FindDataDisk chose it), sets it up
// if (and only if) it is blank or its first-time setup was interrupted,
// unlocks it and mounts it. A disk whose header says setup completed is
// never formatted; a disk that is neither blank nor ours is refused.
func Open(ctx context.Context, c Config) (*Result, error) {
	if c.Log == nil {
		c.Log = slog.Default()
	}
	if c.Mode != ModeCrypt && c.Mode != ModeAuthenticated {
		return nil, fmt.Errorf("unknown storage mode %d", c.Mode)
	}
	o := &opener{Config: c, res: &Result{}}
	if err := o.step("find data disk", o.findDisk); err != nil {
		return o.res, err
	}
	o.Log.Info("storage: data disk", "disk", o.disk.Path, "size", humanSize(o.disk.Size))

	var hdr *Header
	err := o.step("read partition table and header", func() error {
		var err error
		hdr, err = o.readLayout()
		return err
	})
	if err != nil {
		return o.res, err
	}

	if hdr != nil && hdr.State == StateReady {
		o.Log.Info("storage: disk was set up before", "mode", hdr.Mode.String(), "filesystem", hdr.Filesystem, "key_policy", hdr.KeyPolicy)
		var key []byte
		if err := o.step("unseal node unlock key", func() error {
			var err error
			key, err = o.unlock(hdr)
			return err
		}); err != nil {
			return o.res, err
		}
		if err := o.step("map encrypted volume", func() error { return o.mapVolume(hdr, key) }); err != nil {
			return o.res, err
		}
		o.res.nuk = key
		if err := o.step("mount "+c.MountPoint, func() error { return o.mount(hdr) }); err != nil {
			return o.res, fmt.Errorf("%w (the disk is left as it is: it is never reformatted because a mount failed)", err)
		}
	} else {
		// Blank, or a first-time setup that never finished: nothing on
		// the volume can be trusted, so set it up from the start.
		o.res.Resumed = hdr != nil
		if o.res.Resumed {
			o.Log.Warn("storage: an earlier first-time setup was interrupted; setting the disk up again")
		}
		if err := o.setup(ctx, hdr); err != nil {
			return o.res, err
		}
		o.res.Initialised = true
	}
	o.res.Mapped = "/dev/mapper/" + MappedName
	if sz, err := blockdev.Size(o.res.Mapped); err == nil {
		o.res.Size = sz
	}
	return o.res, nil
}

// findDisk opens the disk the caller named; there is no default, so that
// every call of a boot uses the disk chosen once (FindDataDisk).
func (o *opener) findDisk() error {
	if o.Disk == "" {
		return errNoDisk
	}
	sz, err := blockdev.Size(o.Disk)
	if err != nil {
		return err
	}
	o.disk = blockdev.Disk{Name: filepath.Base(o.Disk), Path: o.Disk, Size: sz}
	return nil
}

// policy is the key policy recorded in the header: the key protector's,
// marked when the cluster unlock key is mixed in.
func (o *opener) policy() string {
	if o.ClusterUnlockKey != nil {
		return o.Keys.Policy() + "+cluster"
	}
	return o.Keys.Policy()
}

func (o *opener) unlock(h *Header) ([]byte, error) {
	if h.KeyPolicy != o.policy() {
		if strings.HasSuffix(h.KeyPolicy, "+cluster") && o.ClusterUnlockKey == nil {
			return nil, fmt.Errorf("%w: the disk's key needs the cluster unlock key, which this boot does not have", ErrRefused)
		}
		return nil, fmt.Errorf("%w: the disk's key is protected by %q but this node runs with %q", ErrRefused, h.KeyPolicy, o.policy())
	}
	key, err := o.Keys.Unseal(h.SealedKey)
	if err != nil {
		return nil, fmt.Errorf("%w: cannot unseal the node unlock key: %v", ErrRefused, err)
	}
	return key, nil
}

func (o *opener) setup(ctx context.Context, previous *Header) error {
	if c, ok := o.Keys.(sealChecker); ok {
		if err := c.CanSeal(); err != nil {
			return fmt.Errorf("setting up the data disk: %w (nothing was written)", err)
		}
	}
	if o.res.Partition == "" {
		if err := o.step("write partition table", o.partition); err != nil {
			return err
		}
	}
	nuk := make([]byte, 32)
	if _, err := rand.Read(nuk); err != nil {
		return err
	}
	var h *Header
	if err := o.step("seal new node unlock key", func() error {
		blob, err := o.Keys.Seal(nuk)
		if err != nil {
			return err
		}
		h = &Header{Version: HeaderVersion, State: StateInitialising, Mode: o.Mode, Filesystem: o.Filesystem,
			PartitionID: o.part.ID, SealedKey: blob, KeyPolicy: o.policy(), Created: uint64(time.Now().Unix()),
			Enrolment: o.Enrolment}
		if previous != nil {
			h.Sequence = previous.Sequence
		}
		return o.writeHeader(h)
	}); err != nil {
		return err
	}
	if err := o.step("map encrypted volume", func() error { return o.mapVolume(h, nuk) }); err != nil {
		return err
	}
	o.res.nuk = nuk
	if o.Mode == ModeAuthenticated {
		if err := o.step("discard the fresh authenticated volume", func() error { return discardAll("/dev/mapper/" + MappedName) }); err != nil {
			return err
		}
	}
	if err := o.step("make "+o.Filesystem+" filesystem", func() error {
		return mkfs(ctx, o.Filesystem, "/dev/mapper/"+MappedName, o.part.ID, o.Mode == ModeAuthenticated)
	}); err != nil {
		return err
	}
	if err := o.step("mount "+o.MountPoint, func() error { return o.mount(h) }); err != nil {
		return err
	}
	// Only now is the setup complete: a crash before this line makes the
	// next boot start over, one after it never formats again.
	h.State = StateReady
	return o.step("mark setup complete", func() error { return o.writeHeader(h) })
}

func (o *opener) partition() error {
	f, err := os.OpenFile(o.disk.Path, os.O_RDWR, 0)
	if err != nil {
		return err
	}
	defer f.Close()
	var p gpt.Partition
	if o.flashed != nil {
		// A flashed disk: the data partition is added to its table, in
		// the free space, and the kernel told about it alone (the system
		// slot is in use, so the whole table cannot be re-read).
		p, err = o.flashed.AddPartition(o.disk.Size, DataPartitionType, gpt.RandomGUID(), "plinth-data")
		if err != nil {
			return err
		}
		// The new range may hold leftovers (the image's backup table):
		// its header region starts zero, so nothing stale is read.
		if _, err := f.WriteAt(make([]byte, HeaderSize), p.Offset()); err != nil {
			return err
		}
		if err := gpt.Write(f, o.disk.Size, o.flashed); err != nil {
			return err
		}
		if err := f.Sync(); err != nil {
			return err
		}
		f.Close()
		if err := blockdev.AddPartition(o.disk.Path, p.Number, p.Offset(), p.Size()); err != nil {
			return err
		}
	} else {
		t, err := gpt.SinglePartition(o.disk.Size, DataPartitionType, gpt.RandomGUID(), gpt.RandomGUID(), "plinth-data")
		if err != nil {
			return err
		}
		if err := gpt.Write(f, o.disk.Size, t); err != nil {
			return err
		}
		if err := f.Sync(); err != nil {
			return err
		}
		f.Close()
		p = t.Partitions[0]
		if err := blockdev.RereadPartitions(o.disk.Path, p.Number); err != nil {
			return err
		}
	}
	o.part = p
	o.res.Partition = blockdev.PartitionPath(o.disk.Path, p.Number)
	return checkPartitionDevice(sysBlock, filepath.Base(o.disk.Path), o.res.Partition, p)
}

func (o *opener) writeHeader(h *Header) error {
	f, err := os.OpenFile(o.res.Partition, os.O_RDWR, 0)
	if err != nil {
		return err
	}
	defer f.Close()
	if err := WriteHeader(f, 0, h); err != nil {
		return err
	}
	return f.Sync()
}

// mapVolume maps the partition behind the header:
//
//	ModeCrypt:          partition ─► dm-crypt "data" (AES-256-XTS, 4 KiB sectors)
//	ModeAuthenticated:  partition ─► dm-integrity "data-integrity" (HMAC-SHA256 tag per
//	                    sector, journalled) ─► dm-crypt "data" (AES-256-XTS)
//
// In authenticated mode a changed ciphertext sector fails its keyed tag
// and reads as an I/O error instead of decrypting to garbage.
func (o *opener) mapVolume(h *Header, nuk []byte) error {
	key, err := DeriveVolumeKey(nuk, o.ClusterUnlockKey, o.part.ID, h.Mode)
	if err != nil {
		return err
	}
	defer clear(key)
	lower, offset := o.res.Partition, int64(HeaderSize)/512
	if h.Mode == ModeAuthenticated {
		if lower, err = mapIntegrity(o.res.Partition, offset, key[CryptKeySize:]); err != nil {
			return err
		}
		offset = 0
	}
	dev, err := blockdev.MajorMinor(lower)
	if err != nil {
		return err
	}
	size, err := blockdev.Size(lower)
	if err != nil {
		return err
	}
	sectors := (size/512 - offset) &^ 7 // whole 4 KiB crypto sectors
	if sectors <= 0 {
		return fmt.Errorf("data partition %s is too small (%d bytes)", o.res.Partition, size)
	}
	table := []devicemapper.Target{{Start: 0, Length: uint64(sectors), Type: "crypt",
		Params: fmt.Sprintf("aes-xts-plain64 %s 0 %s %d 2 allow_discards sector_size:4096", hex.EncodeToString(key[:CryptKeySize]), dev, offset)}}
	return activate(MappedName, table)
}

// IntegrityName is the device-mapper name of the integrity layer.
const IntegrityName = "data-integrity"

// mapIntegrity maps dm-integrity with a keyed HMAC-SHA256 per sector over
// part (skipping offset sectors). A zeroed area is formatted by the kernel
// on first use. Sectors never written have no valid tag and fail to read;
// the filesystem never reads what it did not write, as long as mkfs
// writes its journal (see mkfs). The kernel refuses to compute tags for
// existing data with a keyed hash ("recalculate"), rightly: it would
// bless whatever an attacker put there. The kernel decides how many sectors remain for data once its tags and
// journal are placed, so the device is first mapped small to read that.
func mapIntegrity(part string, offset int64, macKey []byte) (string, error) {
	dev, err := blockdev.MajorMinor(part)
	if err != nil {
		return "", err
	}
	params := fmt.Sprintf("%s %d 32 J 2 internal_hash:hmac(sha256):%s allow_discards", dev, offset, hex.EncodeToString(macKey))
	probe := []devicemapper.Target{{Length: 8, Type: "integrity", Params: params}}
	if err := activate(IntegrityName, probe); err != nil {
		return "", err
	}
	st, err := devicemapper.Status(IntegrityName, false)
	devicemapper.Remove(IntegrityName)
	if err != nil {
		return "", err
	}
	// Status: "<mismatches> <provided data sectors> <recalculating sector or ->".
	var mismatches, provided uint64
	if len(st) != 1 {
		return "", fmt.Errorf("dm-integrity status: %d targets", len(st))
	}
	if _, err := fmt.Sscan(st[0].Params, &mismatches, &provided); err != nil || provided == 0 {
		return "", fmt.Errorf("dm-integrity status %q: %v", st[0].Params, err)
	}
	full := []devicemapper.Target{{Length: provided, Type: "integrity", Params: params}}
	if err := activate(IntegrityName, full); err != nil {
		return "", err
	}
	return "/dev/mapper/" + IntegrityName, nil
}

func activate(name string, table []devicemapper.Target) error {
	if _, err := devicemapper.Create(name); err != nil {
		return err
	}
	if err := devicemapper.LoadTable(name, table, false); err != nil {
		devicemapper.Remove(name)
		return err
	}
	if err := devicemapper.Resume(name); err != nil {
		devicemapper.Remove(name)
		return err
	}
	return nil
}

// discardAll discards the whole device. On a fresh authenticated volume
// no sector has a valid tag yet, and mkfs reads before it writes (old
// signatures, partial pages); dm-integrity marks discarded sectors so
// that they read back instead of failing their check. The price, as with
// cryptsetup's --allow-discards: someone with the disk can mark a sector
// discarded so that it reads back unchecked. They still cannot choose what
// it decrypts to (XTS above), only make it garbage.
func discardAll(dev string) error {
	f, err := os.OpenFile(dev, os.O_WRONLY, 0)
	if err != nil {
		return err
	}
	defer f.Close()
	size, err := f.Seek(0, 2)
	if err != nil {
		return err
	}
	r := [2]uint64{0, uint64(size)}
	if _, _, errno := unix.Syscall(unix.SYS_IOCTL, f.Fd(), unix.BLKDISCARD, uintptr(unsafe.Pointer(&r[0]))); errno != 0 {
		return fmt.Errorf("discarding %s: %w", dev, errno)
	}
	return nil
}

// mkfs makes the filesystem. Lazy inode table init keeps first boot fast
// (the kernel zeroes them in the background, writing, never reading). On
// an authenticated volume the journal is written in full, because journal
// replay reads it and unwritten sectors have no valid tags.
func mkfs(ctx context.Context, fs, dev string, id gpt.GUID, authenticated bool) error {
	var cmd *exec.Cmd
	switch fs {
	case "ext4":
		lazyJournal := "1"
		if authenticated {
			lazyJournal = "0"
		}
		cmd = exec.CommandContext(ctx, "/usr/sbin/mkfs.ext4", "-q", "-F", "-m", "0", "-L", "plinth-data",
			"-U", id.String(), "-O", "quota,project", "-E", "quotatype=prjquota,lazy_itable_init=1,lazy_journal_init="+lazyJournal, dev)
	case "xfs":
		cmd = exec.CommandContext(ctx, "/usr/sbin/mkfs.xfs", "-q", "-f", "-L", "plinth-data", "-m", "uuid="+id.String(), dev)
	default:
		return fmt.Errorf("unsupported filesystem %q", fs)
	}
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	if err := cmd.Run(); err != nil {
		return fmt.Errorf("%s: %v: %s", cmd.Path, err, strings.TrimSpace(out.String()))
	}
	return nil
}

func (o *opener) mount(h *Header) error {
	if err := os.MkdirAll(o.MountPoint, 0o755); err != nil {
		return err
	}
	dev := "/dev/mapper/" + MappedName
	err := unix.Mount(dev, o.MountPoint, h.Filesystem, unix.MS_NODEV|unix.MS_NOSUID, mountOptions[h.Filesystem])
	if errors.Is(err, unix.EINVAL) && mountOptions[h.Filesystem] != "" {
		// An ext4 volume made before its project feature refuses
		// prjquota: mounted without, it has no local volumes.
		o.Log.Warn("storage: the data volume refused its quota mount option; mounting it without (no local volumes on this node)",
			"options", mountOptions[h.Filesystem], "err", err)
		err = unix.Mount(dev, o.MountPoint, h.Filesystem, unix.MS_NODEV|unix.MS_NOSUID, "")
	}
	if err != nil {
		return err
	}
	// Asked, never required: a node whose filesystem has none still
	// boots, and only local volumes are refused on it.
	on, err := ProjectQuotaOn(dev)
	if err != nil {
		o.Log.Warn("storage: project quota state unknown", "err", err)
	}
	o.res.ProjectQuota = on
	return nil
}

// mountOptions are the data volume's mount options by filesystem:
// prjquota turns project quota enforcement on. XFS turns accounting on
// with it too (on a filesystem made without it, it checks its quotas
// once first); ext4 accounts from its quota and project features, set at
// mkfs, but enforces limits only with the option.
var mountOptions = map[string]string{"xfs": "prjquota", "ext4": "prjquota"}

// Close unmounts and unmaps the data volume.
func Close(mountPoint string) error {
	unix.Sync()
	if err := unix.Unmount(mountPoint, 0); err != nil {
		return fmt.Errorf("unmounting %s: %w", mountPoint, err)
	}
	if err := devicemapper.Remove(MappedName); err != nil {
		return err
	}
	if _, err := devicemapper.Info(IntegrityName); err == nil {
		return devicemapper.Remove(IntegrityName)
	}
	return nil
}

func humanSize(n int64) string {
	if n < 1<<30 {
		return fmt.Sprintf("%d MiB", n>>20)
	}
	return fmt.Sprintf("%.1f GiB", float64(n)/(1<<30))
}
