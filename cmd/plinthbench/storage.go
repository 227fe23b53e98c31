package main

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"time"

	"plinth.dev/plinth/launch"
)

var (
	storageStepRE  = regexp.MustCompile(`I init: storage: (.+) took=(\S+)$`)
	storageBenchRE = regexp.MustCompile(`I init: storage benchmark .*raw_write_mbps=(\S+) raw_read_mbps=(\S+) crypt_write_mbps=(\S+) crypt_read_mbps=(\S+)`)
)

// benchStorage boots one machine twice (first-time setup, then unlock) and
// reports each storage step, plus dm-crypt against the raw disk measured
// inside the VM on a scratch disk.
func benchStorage(ctx context.Context, img *launch.Image, work string, add func(name string, v float64, unit, note string)) error {
	dir := filepath.Join(work, "storage")
	if err := os.MkdirAll(filepath.Join(dir, "tpm"), 0o755); err != nil {
		return err
	}
	params, err := launch.WriteParameters(filepath.Join(dir, "parameters.pb"), launch.BootstrapParameters())
	if err != nil {
		return err
	}
	scratch := filepath.Join(dir, "scratch.img")
	if err := os.WriteFile(scratch, nil, 0o644); err != nil {
		return err
	}
	if err := os.Truncate(scratch, 256<<20); err != nil {
		return err
	}
	for i, boot := range []string{"first_boot", "later_boot"} {
		o := img.NodeOptions("storage").WithParameters(params)
		o.WorkDir = filepath.Join(dir, boot)
		os.MkdirAll(o.WorkDir, 0o755)
		o.DiskPath, o.DiskSizeBytes = filepath.Join(dir, "disk.img"), 2<<30
		o.TPMStateDir = filepath.Join(dir, "tpm")
		if i == 1 {
			o.Cmdline += " plinth.bench=storage"
			o.ExtraArgs = append(o.ExtraArgs, "-drive", "if=virtio,format=raw,cache=unsafe,file="+scratch)
		}
		if err := storageBoot(ctx, o, boot, i == 1, add); err != nil {
			return fmt.Errorf("%s: %w", boot, err)
		}
	}
	return nil
}

func storageBoot(ctx context.Context, o launch.NodeOptions, boot string, measureCrypt bool, add func(string, float64, string, string)) error {
	ctx, cancel := context.WithTimeout(ctx, 5*time.Minute)
	defer cancel()
	n, err := launch.Launch(ctx, o)
	if err != nil {
		return err
	}
	defer n.Close()
	if _, err := n.WaitForLine(ctx, regexp.MustCompile(`I init: node ready`)); err != nil {
		return err
	}
	if measureCrypt {
		m, err := n.WaitForLine(ctx, storageBenchRE)
		if err != nil {
			return err
		}
		v := make([]float64, 4)
		for i := range v {
			v[i], _ = strconv.ParseFloat(m[i+1], 64)
		}
		add("storage_raw_write_mbps", v[0], "MB/s", "scratch disk in the VM, O_DIRECT, 128 MiB")
		add("storage_raw_read_mbps", v[1], "MB/s", "")
		add("storage_crypt_write_mbps", v[2], "MB/s", "dm-crypt AES-256-XTS, 4 KiB sectors, same disk")
		add("storage_crypt_read_mbps", v[3], "MB/s", "")
		add("storage_crypt_write_ratio", v[2]/v[0], "x", "crypt / raw")
		add("storage_crypt_read_ratio", v[3]/v[1], "x", "crypt / raw")
	}
	var total time.Duration
	for _, l := range n.Lines() {
		m := storageStepRE.FindStringSubmatch(l)
		if m == nil {
			continue
		}
		d, err := time.ParseDuration(m[2])
		if err != nil {
			continue
		}
		total += d
		add("storage_"+boot+"_"+strings.ReplaceAll(m[1], " ", "_")+"_ms", float64(d.Microseconds())/1000, "ms", "")
	}
	add("storage_"+boot+"_total_ms", float64(total.Microseconds())/1000, "ms", "sum of the storage steps")
	if err := n.PowerDown(ctx); err != nil {
		return err
	}
	return n.Wait(ctx)
}
