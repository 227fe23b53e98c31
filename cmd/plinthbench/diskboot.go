package main

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"syscall"
	"time"

	"plinth.dev/plinth/image"
	"plinth.dev/plinth/launch"
)

// benchDiskBoot: the deployable artefacts' sizes, and boot → node ready
// through OVMF from disk.img (written by image.WriteDisk, parameters on
// the ESP) against the direct kernel boot, interleaved, plus whether the
// node found its live PCRs 4 and 11 equal to the predictions.
func benchDiskBoot(ctx context.Context, img *launch.Image, work string, boots int, add addFunc) error {
	for _, a := range []string{image.UKIFile, image.UKISlotFile("a"), image.DiskFile} {
		add("size_"+a+"_mib", float64(img.Manifest.Artefacts[a].Size)/(1<<20), "MiB", "")
	}
	if st, err := os.Stat(filepath.Join(img.Dir, image.DiskFile)); err == nil {
		if sys, ok := st.Sys().(*syscall.Stat_t); ok {
			add("size_disk.img_allocated_mib", float64(sys.Blocks*512)/(1<<20), "MiB", "sparse: what a flash writes beyond zeros")
		}
	}
	p := launch.BootstrapParameters()
	p.Tpm.AllowUnmeasuredBoot = true // the direct boots need it; the disk boots are measured
	params, err := launch.WriteParameters(filepath.Join(work, "diskboot-parameters.pb"), p)
	if err != nil {
		return err
	}
	dir := filepath.Join(work, "diskboot")
	direct, disk := filepath.Join(dir, "direct"), filepath.Join(dir, "disk")
	for _, d := range []string{direct, disk} {
		if err := os.MkdirAll(filepath.Join(d, "tpm"), 0o755); err != nil {
			return err
		}
	}
	t := time.Now()
	if err := img.FlashDisk(filepath.Join(disk, "disk.img"), 2<<30, params); err != nil {
		return err
	}
	add("write_disk_seconds", time.Since(t).Seconds(), "s", "write-disk of disk.img onto a new file, read back")
	ready := `I init: node ready uptime=([0-9.]+)s`
	var dw, dg, uw, ug []float64
	predicted := 0.0
	// Boot 0 of each sets the data disk up; the measured boots unlock it.
	for i := -1; i < boots; i++ {
		o := img.NodeOptions("direct").WithParameters(params)
		o.WorkDir = filepath.Join(direct, fmt.Sprint(i+1))
		o.DiskPath, o.DiskSizeBytes = filepath.Join(direct, "disk.img"), 2<<30
		o.TPMStateDir = filepath.Join(direct, "tpm")
		w, g, err := bootUntil(ctx, o, ready)
		if err != nil {
			return fmt.Errorf("direct boot: %w", err)
		}
		u, err := img.DiskBootOptions("disk", filepath.Join(disk, "disk.img"), 2<<30, params)
		if err != nil {
			return err
		}
		u.UEFI = &launch.UEFI{Vars: filepath.Join(disk, "OVMF_VARS.fd")}
		u.WorkDir = filepath.Join(disk, fmt.Sprint(i+1))
		u.TPMStateDir = filepath.Join(disk, "tpm")
		w2, g2, ok, err := diskBootUntil(ctx, u, ready)
		if err != nil {
			return fmt.Errorf("disk boot: %w", err)
		}
		if i < 0 {
			continue
		}
		dw, dg, uw, ug = append(dw, w), append(dg, g), append(uw, w2), append(ug, g2)
		if ok {
			predicted++
		}
	}
	note := fmt.Sprintf("median of %d, %s", boots, accelName())
	add("boot_direct_to_node_ready_wall_seconds", median(dw), "s", note+", QEMU -kernel")
	add("boot_disk_to_node_ready_wall_seconds", median(uw), "s", note+", OVMF + disk.img (firmware included)")
	add("boot_disk_to_node_ready_guest_seconds", median(ug), "s", note+", guest uptime (after firmware)")
	add("boot_direct_to_node_ready_guest_seconds", median(dg), "s", note)
	add("boot_disk_over_direct_wall", median(uw)/median(dw), "x", "disk boot / direct boot, wall")
	add("pcr_predictions_correct", predicted/float64(boots), "", "fraction of disk boots whose live PCRs 4 and 11 equal the predictions (1 = all)")
	return nil
}

// diskBootUntil is bootUntil for a disk boot, which also waits for the
// node's check of its PCR predictions (it runs beside the boot) and
// reports whether they held.
func diskBootUntil(ctx context.Context, o launch.NodeOptions, re string) (wall, guest float64, predicted bool, err error) {
	ctx, cancel := context.WithTimeout(ctx, 3*time.Minute)
	defer cancel()
	if err := os.MkdirAll(o.WorkDir, 0o755); err != nil {
		return 0, 0, false, err
	}
	t := time.Now()
	n, err := launch.Launch(ctx, o)
	if err != nil {
		return 0, 0, false, err
	}
	defer n.Close()
	m, err := n.WaitForLine(ctx, regexp.MustCompile(re))
	if err != nil {
		return 0, 0, false, err
	}
	wall = time.Since(t).Seconds()
	guest, _ = strconv.ParseFloat(m[1], 64)
	pctx, pcancel := context.WithTimeout(ctx, 30*time.Second)
	defer pcancel()
	_, perr := n.WaitForLine(pctx, regexp.MustCompile(`measured boot: live PCRs (equal|differ from) the UKI's predictions`))
	line := ""
	for _, l := range n.Lines() {
		if regexp.MustCompile(`measured boot: live PCRs`).MatchString(l) {
			line = l
		}
	}
	return wall, guest, perr == nil && regexp.MustCompile(`equal the UKI's predictions`).MatchString(line), nil
}
