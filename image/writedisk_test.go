package image

import (
	"bytes"
	"context"
	"crypto/sha256"
	"errors"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"plinth.dev/plinth/platform/gpt"
	"plinth.dev/plinth/platform/layout"
	"plinth.dev/plinth/platform/storage"
)

// checkWriteDisk: WriteDisk puts disk.img and the parameters onto a new
// file (checked by reading it back), refuses bad targets without writing,
// and overwrites a node's data disk only with Force.
func checkWriteDisk(t *testing.T, out string, m *Manifest) {
	t.Helper()
	ctx := context.Background()
	dir := t.TempDir()
	params := []byte("node parameters stand-in")
	target := filepath.Join(dir, "disk.raw")
	var progress strings.Builder
	if err := WriteDisk(ctx, WriteDiskConfig{ImageDir: out, Parameters: params, Target: target, Progress: &progress}); err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(progress.String(), "written and verified") || !strings.Contains(progress.String(), "(100%)") {
		t.Errorf("progress:\n%s", progress.String())
	}
	st, _ := os.Stat(target)
	if st.Size() != m.Disk.Size+MinDataBytes {
		t.Errorf("new target is %d bytes, want %d", st.Size(), m.Disk.Size+MinDataBytes)
	}
	esp := filepath.Join(dir, "esp.img")
	f, _ := os.Open(target)
	data := make([]byte, int64(m.Disk.Partitions[0].LastLBA-m.Disk.Partitions[0].FirstLBA+1)*gpt.SectorSize)
	f.ReadAt(data, int64(m.Disk.Partitions[0].FirstLBA)*gpt.SectorSize)
	os.WriteFile(esp, data, 0o644)
	if got, err := exec.Command("mtype", "-i", esp, "::"+layout.ESPParameters).Output(); err != nil || !bytes.Equal(got, params) {
		t.Errorf("parameters on the ESP: %q, %v", got, err)
	}
	if o, err := exec.Command("fsck.vfat", "-n", esp).CombinedOutput(); err != nil {
		t.Errorf("fsck.vfat: %v\n%s", err, o)
	}
	// The rest is disk.img's.
	slot, want := make([]byte, 1<<20), make([]byte, 1<<20)
	f.ReadAt(slot, int64(m.Disk.Partitions[1].FirstLBA)*gpt.SectorSize)
	f.Close()
	img, _ := os.Open(filepath.Join(out, DiskFile))
	img.ReadAt(want, int64(m.Disk.Partitions[1].FirstLBA)*gpt.SectorSize)
	img.Close()
	if !bytes.Equal(slot, want) {
		t.Error("slot a differs from disk.img's")
	}

	// A node's disk: refused, untouched; Force writes it.
	node := filepath.Join(dir, "node.raw")
	size := m.Disk.Size + MinDataBytes
	nf, _ := os.Create(node)
	nf.Truncate(size)
	tab, _ := gpt.SinglePartition(size, storage.DataPartitionType, gpt.RandomGUID(), gpt.RandomGUID(), "plinth-data")
	if err := gpt.Write(nf, size, tab); err != nil {
		t.Fatal(err)
	}
	nf.Close()
	before := fileHash(t, node)
	err := WriteDisk(ctx, WriteDiskConfig{ImageDir: out, Parameters: params, Target: node})
	if !errors.Is(err, ErrTargetRefused) || !strings.Contains(err.Error(), "Plinth data partition") {
		t.Errorf("a node's data disk: %v", err)
	}
	if fileHash(t, node) != before {
		t.Error("a refused target was changed")
	}
	if err := WriteDisk(ctx, WriteDiskConfig{ImageDir: out, Parameters: params, Target: node, Force: true}); err != nil {
		t.Errorf("--force: %v", err)
	}

	// Too small, no parameters: refused, nothing created.
	for name, c := range map[string]WriteDiskConfig{
		"too small":     {ImageDir: out, Parameters: params, Target: filepath.Join(dir, "small.raw"), Size: m.Disk.Size},
		"no parameters": {ImageDir: out, Target: filepath.Join(dir, "none.raw")},
	} {
		if err := WriteDisk(ctx, c); !errors.Is(err, ErrTargetRefused) {
			t.Errorf("%s: %v", name, err)
		}
		if _, err := os.Stat(c.Target); err == nil {
			t.Errorf("%s: %s was created", name, c.Target)
		}
	}
}

func TestMountedFrom(t *testing.T) {
	info := filepath.Join(t.TempDir(), "mountinfo")
	os.WriteFile(info, []byte(`22 1 8:1 / / rw,relatime shared:1 - ext4 /dev/sda1 rw
30 22 259:2 / /boot/efi rw - vfat /dev/nvme0n1p2 rw
31 22 0:5 / /dev rw - devtmpfs udev rw
`), 0o644)
	for dev, want := range map[string]string{"/dev/sda": "/", "/dev/nvme0n1": "/boot/efi", "/dev/sdb": "", "/dev/sda1": "/", "/dev/nvme0n": ""} {
		if got, err := mountedFrom(info, dev); err != nil || got != want {
			t.Errorf("%s: %q, %v; want %q", dev, got, err, want)
		}
	}
}

func TestDataPartitionTypeAgrees(t *testing.T) {
	if dataPartitionType != storage.DataPartitionType {
		t.Fatal("image's copy of the data partition type differs from storage's")
	}
}

func fileHash(t *testing.T, p string) [32]byte {
	t.Helper()
	f, err := os.Open(p)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	h := sha256.New()
	if _, err := io.Copy(h, f); err != nil {
		t.Fatal(err)
	}
	return [32]byte(h.Sum(nil))
}
