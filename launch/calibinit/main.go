// Command calibinit is the whole userspace of plinthbench's calibration:
// the image's own `kube apiserver` alone, with a plain embedded etcd on
// tmpfs, started by this tiny init on the board's kernel in the same VM
// shape as a node. It times the API server's start to its first /readyz
// 200 and prints one console line (Line, which plinthbench parses):
//
//	calibration: exec at 8.12 s, ready at 35.90 s uptime (with plain, init 1.20 s, etcd ready 2.31 s, apiserver peak rss 301 MiB, init peak rss 44 MiB, apiserver cpu 40.10 s, init cpu 3.20 s)
//
// then powers off. Any failure prints "calibration: failed: ..." and
// powers off too.
//
// The initramfs (launch.BuildInitramfs) holds this program as /init, the
// multi-call kube binary as /kube and /etc/hosts (kube-apiserver's
// loopback client dials "localhost" when it binds 0.0.0.0).
//
// It must be built static (CGO_ENABLED=0): the initramfs has no libc.
package main

import (
	"bytes"
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"errors"
	"fmt"
	"math/big"
	"net"
	"net/http"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"go.etcd.io/etcd/server/v3/embed"
	"golang.org/x/sys/unix"

	"plinth.dev/plinth/platform/layout"
)

const (
	kube    = "/kube"
	dir     = "/run/calibration" // certificates and keys (tmpfs)
	etcdDir = "/run/etcd"        // etcd's data (tmpfs)
	apiLog  = "/run/apiserver.log"
	etcdLog = "/run/etcd.log"
	etcdURL = "http://127.0.0.1:2379"
	// timeout bounds the whole start: plinthbench waits longer.
	timeout = 15 * time.Minute
)

var (
	console = os.Stdout
	readyz  = "https://127.0.0.1:" + strconv.Itoa(layout.KubernetesAPIPort) + "/readyz"
)

func main() {
	initAt := mounts()
	if err := run(initAt); err != nil {
		fmt.Fprintf(console, "calibration: failed: %v\n", err)
		for _, f := range []string{apiLog, etcdLog} {
			if t := tail(f, 15); t != "" {
				fmt.Fprintf(console, "calibration: last lines of %s:\n%s\n", f, t)
			}
		}
	}
	console.Sync()
	unix.Sync()
	if err := unix.Reboot(unix.LINUX_REBOOT_CMD_POWER_OFF); err != nil {
		fmt.Fprintf(console, "calibration: failed: power off: %v\n", err)
	}
	// PID 1 must never return: the kernel would panic.
	for {
		time.Sleep(time.Hour)
	}
}

// mounts mounts what etcd and kube-apiserver need, opens the console
// (the initramfs has no /dev/console node, so the kernel started us
// without stdio) and returns the uptime at /init's start.
func mounts() float64 {
	var errs []string
	for _, m := range []struct{ fs, dir string }{
		{"proc", "/proc"}, {"sysfs", "/sys"}, {"devtmpfs", "/dev"}, {"tmpfs", "/tmp"}, {"tmpfs", "/run"},
	} {
		os.MkdirAll(m.dir, 0o755)
		if err := unix.Mount(m.fs, m.dir, m.fs, 0, ""); err != nil && err != unix.EBUSY {
			errs = append(errs, fmt.Sprintf("mount %s: %v", m.dir, err))
		}
	}
	if f, err := os.OpenFile("/dev/console", os.O_RDWR, 0); err == nil {
		console = f
	}
	for _, e := range errs {
		fmt.Fprintf(console, "calibration: %s\n", e)
	}
	up, _ := uptime()
	return up
}

func run(initAt float64) error {
	if err := loopbackUp(); err != nil {
		return fmt.Errorf("loopback: %w", err)
	}
	if err := writeCredentials(); err != nil {
		return fmt.Errorf("credentials: %w", err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()

	// A plain embedded etcd, data on tmpfs, plain HTTP on loopback.
	cfg := embed.NewConfig()
	cfg.Dir = etcdDir
	cfg.LogOutputs = []string{etcdLog}
	for _, u := range []*[]url.URL{&cfg.ListenClientUrls, &cfg.AdvertiseClientUrls} {
		*u = []url.URL{{Scheme: "http", Host: "127.0.0.1:2379"}}
	}
	for _, u := range []*[]url.URL{&cfg.ListenPeerUrls, &cfg.AdvertisePeerUrls} {
		*u = []url.URL{{Scheme: "http", Host: "127.0.0.1:2380"}}
	}
	cfg.InitialCluster = cfg.InitialClusterFromName(cfg.Name)
	e, err := embed.StartEtcd(cfg)
	if err != nil {
		return fmt.Errorf("etcd: %w", err)
	}
	select {
	case <-e.Server.ReadyNotify():
	case err := <-e.Err():
		return fmt.Errorf("etcd: %w", err)
	case <-ctx.Done():
		return fmt.Errorf("etcd: not ready within %v", timeout)
	}
	etcdAt, _ := uptime()

	logf, err := os.Create(apiLog)
	if err != nil {
		return err
	}
	defer logf.Close()
	cmdline, err := os.ReadFile("/proc/cmdline")
	if err != nil {
		return err
	}
	with, policyArgs, err := policies(cmdlineList(cmdline, "calibration.with"))
	if err != nil {
		return err
	}
	cmd := exec.Command(kube, append(apiserverArgs(), policyArgs...)...)
	cmd.Stdout, cmd.Stderr = logf, logf
	// The API server's extra environment (plinthbench's -calibrations
	// GOGC=400: a variant that tries a Go runtime setting on the plain
	// start).
	env := cmdlineList(cmdline, "calibration.env")
	if len(env) > 0 {
		with = strings.Join(env, ",")
	}
	cmd.Env = append([]string{"PATH=/", "HOME=/tmp"}, env...)
	cmd.Dir = "/tmp"
	execAt, _ := uptime()
	if err := cmd.Start(); err != nil {
		return fmt.Errorf("exec %s: %w", kube, err)
	}
	exited := make(chan error, 1)
	go func() { exited <- cmd.Wait() }()

	// As the core's readiness check (roleserver/kubernetes apiReady):
	// anonymous, a long per-request timeout, one kept-alive connection.
	client := &http.Client{
		Timeout:   10 * time.Second,
		Transport: &http.Transport{TLSClientConfig: &tls.Config{InsecureSkipVerify: true, MinVersion: tls.VersionTLS12}},
	}
	var lastErr error
	for {
		if err := check(ctx, client); err == nil {
			break
		} else {
			lastErr = err
		}
		select {
		case err := <-exited:
			return fmt.Errorf("kube apiserver exited (%v) before /readyz answered 200 (last: %v)", err, lastErr)
		case <-ctx.Done():
			return fmt.Errorf("/readyz not 200 within %v of the start (last: %v)", timeout, lastErr)
		case <-time.After(100 * time.Millisecond):
		}
	}
	readyAt, _ := uptime()
	fmt.Fprintf(console, "calibration: exec at %.2f s, ready at %.2f s uptime (with %s, init %.2f s, etcd ready %.2f s, apiserver peak rss %d MiB, init peak rss %d MiB, apiserver cpu %.2f s, init cpu %.2f s)\n",
		execAt, readyAt, with, initAt, etcdAt, peakRSS(cmd.Process.Pid)>>20, peakRSS(os.Getpid())>>20, cpuSeconds(cmd.Process.Pid), cpuSeconds(os.Getpid()))
	cmd.Process.Kill()
	return nil
}

// apiserverArgs are kube-apiserver's flags: those of Plinth's
// controller (roleserver/kubernetes apiserverArgs) that shape its start
// (authorization Node,RBAC, the Service range, service-account keys, a
// client CA), without the admission configuration, audit log,
// encryption at rest, front proxy and kubelet credentials. The
// advertise address is loopback: the endpoint reconciler refuses it, so
// it is off.
func apiserverArgs() []string {
	return []string{
		"apiserver",
		"--advertise-address=127.0.0.1",
		"--endpoint-reconciler-type=none",
		"--bind-address=0.0.0.0",
		"--secure-port=" + strconv.Itoa(layout.KubernetesAPIPort),
		"--etcd-servers=" + etcdURL,
		"--etcd-prefix=/registry",
		"--etcd-compaction-interval=0",
		"--tls-cert-file=" + filepath.Join(dir, "apiserver.pem"),
		"--tls-private-key-file=" + filepath.Join(dir, "apiserver-key.pem"),
		"--client-ca-file=" + filepath.Join(dir, "ca.pem"),
		"--service-account-key-file=" + filepath.Join(dir, "service-account.pub"),
		"--service-account-signing-key-file=" + filepath.Join(dir, "service-account-key.pem"),
		"--service-account-issuer=https://kubernetes.default.svc." + layout.ClusterDomain,
		"--service-cluster-ip-range=" + layout.ServiceCIDR,
		"--authorization-mode=Node,RBAC",
		"--allow-privileged=true",
		"--profiling=false",
		"--v=0",
	}
}

// policies are the flags of the Plinth API server policies of kinds (the
// kernel command line's calibration.with=KIND,...; none: "plain"):
// plinthbench put each policy's files and flags (kubernetes.
// APIServerPolicies) under policyDir, its flags one per line in
// KIND.args.
func policies(kinds []string) (with string, args []string, err error) {
	if len(kinds) == 0 {
		return "plain", nil, nil
	}
	for _, k := range kinds {
		b, err := os.ReadFile(filepath.Join(policyDir, k+".args"))
		if err != nil {
			return "", nil, fmt.Errorf("policy %s: %w", k, err)
		}
		args = append(args, strings.Fields(string(b))...)
	}
	return strings.Join(kinds, "+"), args, nil
}

// cmdlineList is the comma-separated value of key=... on the kernel
// command line (nil if it is absent or empty).
func cmdlineList(cmdline []byte, key string) []string {
	var list []string
	for _, f := range strings.Fields(string(cmdline)) {
		if v, ok := strings.CutPrefix(f, key+"="); ok && v != "" {
			list = strings.Split(v, ",")
		}
	}
	return list
}

// policyDir is where the initramfs holds the policies' files.
const policyDir = "/etc/calibration"

func check(ctx context.Context, client *http.Client) error {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, readyz, nil)
	if err != nil {
		return err
	}
	resp, err := client.Do(req)
	if err != nil {
		return err
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return errors.New(resp.Status)
	}
	return nil
}

// loopbackUp is `ip link set lo up`; the kernel then gives lo 127.0.0.1.
func loopbackUp() error {
	fd, err := unix.Socket(unix.AF_INET, unix.SOCK_DGRAM|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		return err
	}
	defer unix.Close(fd)
	ifr, err := unix.NewIfreq("lo")
	if err != nil {
		return err
	}
	if err := unix.IoctlIfreq(fd, unix.SIOCGIFFLAGS, ifr); err != nil {
		return err
	}
	ifr.SetUint16(ifr.Uint16() | unix.IFF_UP)
	return unix.IoctlIfreq(fd, unix.SIOCSIFFLAGS, ifr)
}

// writeCredentials writes a CA, the API server's serving certificate
// (127.0.0.1, localhost, the kubernetes Service's names) signed by it,
// and the service-account key pair: ECDSA P-256, as Plinth's PKI.
func writeCredentials() error {
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return err
	}
	caKey, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return err
	}
	now := time.Now().Add(-time.Hour) // the guest's clock may lag
	caTmpl := &x509.Certificate{
		SerialNumber:          big.NewInt(1),
		Subject:               pkix.Name{CommonName: "calibration CA"},
		NotBefore:             now,
		NotAfter:              now.Add(24 * time.Hour),
		KeyUsage:              x509.KeyUsageCertSign | x509.KeyUsageDigitalSignature,
		BasicConstraintsValid: true,
		IsCA:                  true,
	}
	caDER, err := x509.CreateCertificate(rand.Reader, caTmpl, caTmpl, &caKey.PublicKey, caKey)
	if err != nil {
		return err
	}
	ca, err := x509.ParseCertificate(caDER)
	if err != nil {
		return err
	}
	srvKey, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return err
	}
	srvDER, err := x509.CreateCertificate(rand.Reader, &x509.Certificate{
		SerialNumber: big.NewInt(2),
		Subject:      pkix.Name{CommonName: "kube-apiserver"},
		NotBefore:    now,
		NotAfter:     now.Add(24 * time.Hour),
		KeyUsage:     x509.KeyUsageDigitalSignature,
		ExtKeyUsage:  []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
		DNSNames:     []string{"localhost", "kubernetes", "kubernetes.default", "kubernetes.default.svc", "kubernetes.default.svc." + layout.ClusterDomain},
		IPAddresses:  []net.IP{net.IPv4(127, 0, 0, 1)},
	}, ca, &srvKey.PublicKey, caKey)
	if err != nil {
		return err
	}
	saKey, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return err
	}
	saPub, err := x509.MarshalPKIXPublicKey(&saKey.PublicKey)
	if err != nil {
		return err
	}
	files := map[string][]byte{
		"ca.pem":                  pemBlock("CERTIFICATE", caDER),
		"apiserver.pem":           pemBlock("CERTIFICATE", srvDER),
		"service-account.pub":     pemBlock("PUBLIC KEY", saPub),
		"apiserver-key.pem":       nil,
		"service-account-key.pem": nil,
	}
	for name, k := range map[string]*ecdsa.PrivateKey{"apiserver-key.pem": srvKey, "service-account-key.pem": saKey} {
		der, err := x509.MarshalPKCS8PrivateKey(k)
		if err != nil {
			return err
		}
		files[name] = pemBlock("PRIVATE KEY", der)
	}
	for name, b := range files {
		if err := os.WriteFile(filepath.Join(dir, name), b, 0o600); err != nil {
			return err
		}
	}
	return nil
}

func pemBlock(typ string, der []byte) []byte {
	return pem.EncodeToMemory(&pem.Block{Type: typ, Bytes: der})
}

func uptime() (float64, error) {
	b, err := os.ReadFile("/proc/uptime")
	if err != nil {
		return 0, err
	}
	f := strings.Fields(string(b))
	if len(f) == 0 {
		return 0, fmt.Errorf("/proc/uptime: %q", b)
	}
	return strconv.ParseFloat(f[0], 64)
}

// peakRSS is a process's VmHWM in bytes (0 if unknown).
func peakRSS(pid int) int64 {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		return 0
	}
	for _, l := range strings.Split(string(b), "\n") {
		if v, ok := strings.CutPrefix(l, "VmHWM:"); ok {
			kb, _ := strconv.ParseInt(strings.TrimSuffix(strings.TrimSpace(v), " kB"), 10, 64)
			return kb << 10
		}
	}
	return 0
}

// cpuSeconds is a process's user + system CPU time (/proc/PID/stat,
// clock ticks of 1/100 s; 0 if unknown).
func cpuSeconds(pid int) float64 {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return 0
	}
	// The command name may hold spaces: fields count from after ")".
	i := bytes.LastIndexByte(b, ')')
	if i < 0 {
		return 0
	}
	f := strings.Fields(string(b[i+1:]))
	if len(f) < 13 {
		return 0
	}
	u, _ := strconv.ParseFloat(f[11], 64)
	st, _ := strconv.ParseFloat(f[12], 64)
	return (u + st) / 100
}

func tail(path string, n int) string {
	b, err := os.ReadFile(path)
	if err != nil {
		return ""
	}
	lines := strings.Split(string(bytes.TrimSpace(b)), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, "\n")
}
