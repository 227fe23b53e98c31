package main

import (
	"bytes"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"plinth.dev/plinth/launch"
)

func TestCalibrationVariants(t *testing.T) {
	got, err := calibrationVariants("plain, all,audit+encryption,,admission,GOGC=400")
	if err != nil {
		t.Fatal(err)
	}
	want := []string{"plain", "admission+audit+encryption", "audit+encryption", "admission", "GOGC=400"}
	if strings.Join(got, ",") != strings.Join(want, ",") {
		t.Errorf("got %q, want %q", got, want)
	}
	for _, bad := range []string{"audit+tracing", "Plain", "audit,fast", "gogc=400", "GOGC=", "=400"} {
		if _, err := calibrationVariants(bad); err == nil {
			t.Errorf("%q: no error", bad)
		}
	}
}

// The policies' files are what the controller writes, and each kind's
// flags name only files the initramfs holds.
func TestCalibrationPolicyFiles(t *testing.T) {
	files, err := calibrationPolicyFiles()
	if err != nil {
		t.Fatal(err)
	}
	have := map[string][]byte{}
	for _, f := range files {
		have["/"+f.Name] = f.Data
	}
	for _, kind := range []string{"admission", "audit", "encryption"} {
		args, ok := have[calibrationPolicyDir+"/"+kind+".args"]
		if !ok {
			t.Fatalf("no %s.args", kind)
		}
		for _, a := range strings.Fields(string(args)) {
			if _, v, ok := strings.Cut(a, "="); ok && strings.HasPrefix(v, "/") {
				if _, ok := have[v]; !ok {
					t.Errorf("%s: %s names %s, not in the initramfs", kind, a, v)
				}
			}
		}
	}
	if !bytes.Contains(have[calibrationPolicyDir+"/encryption.json"], []byte("secretbox")) {
		t.Errorf("encryption.json: %s", have[calibrationPolicyDir+"/encryption.json"])
	}
}

func TestParseCalibrationLine(t *testing.T) {
	l, err := parseCalibrationLine("calibration: exec at 8.12 s, ready at 35.90 s uptime (with admission+audit, init 1.20 s, etcd ready 2.31 s, apiserver peak rss 301 MiB, init peak rss 44 MiB, apiserver cpu 40.10 s, init cpu 3.20 s)")
	if err != nil {
		t.Fatal(err)
	}
	want := calibrationLine{with: "admission+audit", exec: 8.12, ready: 35.90, init: 1.20, etcd: 2.31, apiRSSMiB: 301, initRSS: 44, apiCPU: 40.10, initCPU: 3.20}
	if l != want {
		t.Errorf("got %+v, want %+v", l, want)
	}
	// The bare form (no parenthesis) is enough.
	if l, err := parseCalibrationLine("calibration: exec at 10 s, ready at 37.5 s uptime"); err != nil || l.exec != 10 || l.ready != 37.5 || l.init != 0 {
		t.Errorf("bare line: %+v, %v", l, err)
	}
	// As WaitForLine hands it over (the regexp's match of a console line).
	line := "junk before calibration: exec at 3.50 s, ready at 30.25 s uptime (init 0.90 s)"
	m := calibrationRE.FindStringSubmatch(line)
	if m == nil {
		t.Fatal("calibrationRE does not match")
	}
	if l, err := parseCalibrationLine(m[0]); err != nil || l.exec != 3.5 || l.ready != 30.25 || l.init != 0.9 {
		t.Errorf("matched line: %+v, %v", l, err)
	}
	if !calibrationRE.MatchString("calibration: failed: etcd: boom") {
		t.Error("calibrationRE does not match a failure")
	}
	for _, bad := range []string{
		"calibration: failed: kube apiserver exited (exit status 1) before /readyz answered 200",
		"calibration: exec at 9.0 s, ready at 8.0 s uptime",
		"calibration: exec at x s, ready at 8.0 s uptime",
		"bareinit: reached userspace uptime=1.2",
	} {
		if _, err := parseCalibrationLine(bad); err == nil {
			t.Errorf("%q: no error", bad)
		}
	}
	if _, err := parseCalibrationLine("calibration: failed: etcd: boom"); err == nil || !strings.Contains(err.Error(), "etcd: boom") {
		t.Errorf("failure line: %v", err)
	}
}

func TestCalibrationRatios(t *testing.T) {
	got := map[string]float64{}
	add := calibration{wall: 40, guest: 30}.ratios(func(name string, v float64, unit, note string) { got[name] = v })
	add("kubernetes_api_serving_guest_seconds", 60, "s", "")
	add("kubernetes_node_ready_wall_seconds", 100, "s", "")
	add("kubernetes_reboot_api_serving_wall_seconds", 20, "s", "")
	add("kubernetes_pod_running_wall_seconds", 5, "s", "")
	want := map[string]float64{
		"kubernetes_api_serving_guest_seconds":       60,
		"kubernetes_api_serving_guest_ratio":         2,
		"kubernetes_node_ready_wall_seconds":         100,
		"kubernetes_node_ready_wall_ratio":           2.5,
		"kubernetes_reboot_api_serving_wall_seconds": 20,
		"kubernetes_reboot_api_serving_wall_ratio":   0.5,
		"kubernetes_pod_running_wall_seconds":        5,
	}
	if len(got) != len(want) {
		t.Errorf("got %v, want %v", got, want)
	}
	for k, v := range want {
		if got[k] != v {
			t.Errorf("%s = %v, want %v", k, got[k], v)
		}
	}
	// Without a calibration, add is unchanged.
	n := 0
	calibration{}.ratios(func(string, float64, string, string) { n++ })("kubernetes_api_serving_guest_seconds", 1, "s", "")
	if n != 1 {
		t.Errorf("%d results without a calibration, want 1", n)
	}
}

// TestCalibrationInitramfs reads back an archive of launch.BuildInitramfs
// with the calibration's kind of files: uncompressed newc, parents first.
func TestCalibrationInitramfs(t *testing.T) {
	dir := t.TempDir()
	initBin, big := filepath.Join(dir, "init"), filepath.Join(dir, "kube")
	if err := os.WriteFile(initBin, []byte("#!init"), 0o755); err != nil {
		t.Fatal(err)
	}
	bigData := bytes.Repeat([]byte("kube"), 100001)
	if err := os.WriteFile(big, bigData, 0o755); err != nil {
		t.Fatal(err)
	}
	out := filepath.Join(dir, "initramfs.cpio")
	if err := launch.BuildInitramfs(initBin, out, false,
		launch.InitramfsFile{Name: "kube", Mode: 0o755, Source: big},
		launch.InitramfsFile{Name: "/etc/ssl/hosts", Data: []byte("127.0.0.1 localhost\n")},
	); err != nil {
		t.Fatal(err)
	}
	b, err := os.ReadFile(out)
	if err != nil {
		t.Fatal(err)
	}
	type entry struct {
		name string
		mode uint64
		data string
	}
	var got []entry
	for len(b) > 0 {
		if len(b) < 110 || string(b[:6]) != "070701" {
			t.Fatalf("bad header at %d bytes from the end", len(b))
		}
		field := func(i int) uint64 {
			v, err := strconv.ParseUint(string(b[6+8*i:14+8*i]), 16, 64)
			if err != nil {
				t.Fatal(err)
			}
			return v
		}
		mode, size, namesize := field(1), int(field(6)), int(field(11))
		name := string(b[110 : 110+namesize-1])
		off := (110 + namesize + 3) &^ 3
		data := string(b[off : off+size])
		b = b[(off+size+3)&^3:]
		if name == "TRAILER!!!" {
			break
		}
		got = append(got, entry{name, mode, data})
	}
	if len(b) != 0 {
		t.Errorf("%d bytes after the trailer", len(b))
	}
	want := []entry{
		{"dev", 0o040755, ""}, {"proc", 0o040755, ""}, {"init", 0o100755, "#!init"},
		{"kube", 0o100755, string(bigData)},
		{"etc", 0o040755, ""}, {"etc/ssl", 0o040755, ""}, {"etc/ssl/hosts", 0o100644, "127.0.0.1 localhost\n"},
	}
	if len(got) != len(want) {
		t.Fatalf("%d entries, want %d", len(got), len(want))
	}
	for i := range want {
		if got[i] != want[i] {
			t.Errorf("entry %d: %q %o (%d bytes), want %q %o (%d bytes)", i, got[i].name, got[i].mode, len(got[i].data), want[i].name, want[i].mode, len(want[i].data))
		}
	}
}
