package launch

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"sort"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"plinth.dev/plinth/platform/supervisor"
)

// NodeOptions describe one QEMU node.
type NodeOptions struct {
	Name      string // used for logs/dir names
	Kernel    string // path to bzImage, passed with -kernel
	Initramfs string // path, -initrd
	Cmdline   string // -append
	MemoryMiB int    // default 1024
	CPUs      int    // default 2
	// Disk: a raw image file attached as virtio-blk (format=raw,cache=unsafe).
	// If DiskPath is set and the file does not exist and DiskSizeBytes > 0, create a sparse file of that size.
	DiskPath      string
	DiskSizeBytes int64
	// Disks are further disks, attached after DiskPath in this order. The
	// guest probes virtio disks in PCI slot order, which is this order:
	// DiskPath is vda, Disks[0] vdb, and so on.
	Disks []Disk
	// TPM: unless NoTPM, start a swtpm for this node. TPMStateDir persists TPM state between launches
	// (same dir => same TPM); if empty, a fresh temporary state dir is used and removed on Close.
	NoTPM       bool
	TPMStateDir string
	// FwCfg: extra -fw_cfg name=NAME,file=PATH entries (e.g. "opt/plinth/parameters").
	FwCfg map[string]string
	// Network: user-mode (slirp) NIC on virtio-net-pci; HostForwards add hostfwd=tcp:127.0.0.1:HOST-:GUEST.
	NoNetwork    bool
	HostForwards []Forward
	ExtraArgs    []string
	// WorkDir: where console.log, qemu.log (qemu's stderr), swtpm.log and sockets go. Required.
	// Sockets actually go to a short temporary directory (see the package doc).
	// The logs are truncated by each Launch.
	WorkDir string
	// Console: optional extra writer that receives the raw serial console bytes live (make run uses os.Stdout).
	Console io.Writer
	// UEFI boots the node through OVMF (from its disks, or the network)
	// instead of QEMU's -kernel; nil keeps the direct kernel boot.
	UEFI *UEFI
	// PC makes the node look like a physical machine instead of using
	// QEMU's paravirtual devices (the generic board's test).
	PC *PC
	// SilentStart is how long the guest may print nothing after QEMU
	// starts before Launch counts the start as hung and launches again
	// (silent.go); 0 is DefaultSilentStart, negative for a machine that
	// prints nothing by design (no kernel, no OVMF).
	SilentStart time.Duration
	// Progress receives the harness's own notes about the node (a silent
	// start launched again); nil discards them.
	Progress io.Writer
}

// PC hardware: what the generic board's drivers must find.
type PC struct {
	// SATA puts the disks on the q35 machine's AHCI controller.
	SATA bool
	// NIC is the network device model instead of virtio-net-pci (e.g.
	// e1000e, an Intel 82574L).
	NIC string
	// USBKeyboard adds an xHCI controller with a USB keyboard.
	USBKeyboard bool
}

// UEFI is the firmware of a node booted through OVMF.
type UEFI struct {
	// Code is the firmware (default OVMFCode, Debian's ovmf package).
	Code string
	// Vars is the node's own variable store: it keeps boot entries across
	// launches. Created from OVMFVars if it does not exist.
	Vars string
}

// Debian's OVMF (package ovmf): 4 MiB flash, no Secure Boot enforced,
// TPM 2.0 measured boot.
const (
	OVMFCode = "/usr/share/OVMF/OVMF_CODE_4M.fd"
	OVMFVars = "/usr/share/OVMF/OVMF_VARS_4M.fd"
)

// Disk is a raw disk image file attached as a virtio-blk device.
type Disk struct {
	Path string
	// SizeBytes creates Path as a sparse file of this size if it does not exist.
	SizeBytes int64
	// Serial is the serial number the guest sees (QEMU serial=), if set.
	Serial string
}

// disks returns every disk of o in attachment order.
func (o NodeOptions) disks() []Disk {
	var ds []Disk
	if o.DiskPath != "" {
		ds = append(ds, Disk{Path: o.DiskPath, SizeBytes: o.DiskSizeBytes})
	}
	return append(ds, o.Disks...)
}

// Forward maps a TCP port on the host's 127.0.0.1 to a port of the guest.
type Forward struct{ HostPort, GuestPort int }

// ErrExited is wrapped by WaitForLine and WaitForLineAfter when QEMU exits
// before a matching line appears, so a test can tell "the guest died" from
// "we ran out of time".
var ErrExited = errors.New("qemu exited")

// tailLines is how much console history goes into errors: enough to see a
// panic's backtrace head without drowning the test log.
const tailLines = 20

// Node is one running (or exited) QEMU instance.
type Node struct {
	opts    NodeOptions
	sockDir string
	tpmTemp string // state dir to remove on Close, if we made it
	qmpPath string

	cmd        *exec.Cmd
	consoleLog *os.File
	qemuLog    *os.File
	exited     chan struct{}
	exitErr    error // valid once exited is closed

	tpm   *swtpm
	extra io.Writer // o.Console; dropped after its first error

	spoke     chan struct{} // closed at the guest's first console byte
	hasSpoken bool          // spoke is closed; only consoleSink.Write touches it

	mu      sync.Mutex // guards the console state below
	lines   []string
	partial []byte
	changed chan struct{} // closed and replaced whenever lines grows

	qmpMu     sync.Mutex
	closeOnce sync.Once
	closeErr  error
}

// KVMAvailable reports whether QEMU can use KVM: /dev/kvm opens read-write
// and is backed by hardware virtualisation. The second condition matters
// on sandboxes running under nested PVM (kvm_pvm), which expose /dev/kvm
// but can only run PVM-enabled guest kernels; QEMU then aborts or hangs.
// PLINTH_VMTEST_ACCEL=tcg or =kvm overrides the probe.
func KVMAvailable() bool {
	switch os.Getenv("PLINTH_VMTEST_ACCEL") {
	case "tcg":
		return false
	case "kvm":
		return true
	}
	f, err := os.OpenFile("/dev/kvm", os.O_RDWR, 0)
	if err != nil {
		return false
	}
	f.Close()
	for _, m := range []string{"kvm_intel", "kvm_amd"} {
		if _, err := os.Stat("/sys/module/" + m); err == nil {
			return true
		}
	}
	return false
}

// Launch starts swtpm (unless NoTPM) and QEMU and returns once the guest
// has printed its first byte (or QEMU exited): seconds, not the boot. A
// guest that prints nothing within o.SilentStart is a hung start, which
// Launch records and tries once more (silent.go). ctx bounds only the
// launch itself: the node then lives until it exits, Kill or Close.
func Launch(ctx context.Context, o NodeOptions) (*Node, error) {
	if o.WorkDir == "" {
		return nil, errors.New("launch: NodeOptions.WorkDir is required")
	}
	if err := ctx.Err(); err != nil {
		return nil, fmt.Errorf("launch: %w", err)
	}
	o = o.withDefaults()
	if err := o.prepareFiles(); err != nil {
		return nil, err
	}
	limit := o.silentStartLimit()
	var reports []string
	for try := 1; ; try++ {
		n, err := launchOnce(ctx, o)
		if err != nil {
			return nil, err
		}
		silent, err := n.awaitFirstOutput(ctx, limit)
		if err != nil {
			n.Close()
			return nil, err
		}
		if !silent {
			return n, nil
		}
		report := n.silentStartReport(ctx, limit)
		n.Close()
		keepSilentStart(o.WorkDir, try, report)
		reports = append(reports, report)
		if try == SilentStartTries {
			return nil, fmt.Errorf("launch: node %s: %w in %s, %d times (reports silent-start-N.txt in %s):\n%s",
				o.Name, ErrSilentStart, limit, try, o.WorkDir, strings.Join(reports, "\n"))
		}
		if o.Progress != nil {
			fmt.Fprintf(o.Progress, "launch: node %s: the guest printed nothing in %s, a hung start: launching it again (report: %s)\n%s",
				o.Name, limit, filepath.Join(o.WorkDir, fmt.Sprintf("silent-start-%d.txt", try)), report)
		}
	}
}

// launchOnce starts swtpm and QEMU for one try.
func launchOnce(ctx context.Context, o NodeOptions) (n *Node, err error) {
	n = &Node{opts: o, exited: make(chan struct{}), changed: make(chan struct{}), spoke: make(chan struct{}), extra: o.Console}
	// Until QEMU is started, a failure must undo whatever was already set up;
	// cleanup is the same as Close minus QEMU.
	defer func() {
		if err != nil {
			n.cleanup()
			n = nil
		}
	}()
	if err = n.openFiles(); err != nil {
		return n, err
	}
	tpmSock, err := n.startTPM(ctx)
	if err != nil {
		return n, err
	}
	if err = n.startQEMU(tpmSock); err != nil {
		return n, err
	}
	go n.reap()
	return n, nil
}

// withDefaults fills in the name (the work directory's) and the size of
// the machine.
func (o NodeOptions) withDefaults() NodeOptions {
	if o.Name == "" {
		o.Name = filepath.Base(o.WorkDir)
	}
	if o.MemoryMiB <= 0 {
		o.MemoryMiB = 1024
	}
	if o.CPUs <= 0 {
		o.CPUs = 2
	}
	return o
}

// prepareFiles makes what the node's files need before QEMU starts: the
// work directory, the UEFI variable store (a copy of OVMFVars the first
// time) and the disks.
func (o NodeOptions) prepareFiles() error {
	if err := os.MkdirAll(o.WorkDir, 0o755); err != nil {
		return fmt.Errorf("launch: %w", err)
	}
	if u := o.UEFI; u != nil {
		if u.Vars == "" {
			return fmt.Errorf("launch: node %s: UEFI.Vars is required", o.Name)
		}
		if _, err := os.Stat(u.Vars); errors.Is(err, os.ErrNotExist) {
			data, err := os.ReadFile(OVMFVars)
			if err != nil {
				return fmt.Errorf("launch: node %s: %w (make deps installs ovmf)", o.Name, err)
			}
			if err := os.WriteFile(u.Vars, data, 0o644); err != nil {
				return fmt.Errorf("launch: %w", err)
			}
		}
	}
	for _, d := range o.disks() {
		if d.Path == "" {
			return fmt.Errorf("launch: node %s: a disk without a path", o.Name)
		}
		if err := prepareDisk(d.Path, d.SizeBytes); err != nil {
			return fmt.Errorf("launch: node %s: %w", o.Name, err)
		}
	}
	return nil
}

// openFiles makes the socket directory and truncates the logs of the
// node's launch.
func (n *Node) openFiles() (err error) {
	if n.sockDir, err = shortTempDir(); err != nil {
		return err
	}
	n.qmpPath = filepath.Join(n.sockDir, "qmp.sock")
	if n.consoleLog, err = os.Create(filepath.Join(n.opts.WorkDir, "console.log")); err != nil {
		return fmt.Errorf("launch: %w", err)
	}
	if n.qemuLog, err = os.Create(filepath.Join(n.opts.WorkDir, "qemu.log")); err != nil {
		return fmt.Errorf("launch: %w", err)
	}
	return nil
}

// startTPM starts the node's swtpm, unless NoTPM, and returns its socket
// ("" without a TPM).
func (n *Node) startTPM(ctx context.Context) (string, error) {
	o := n.opts
	if o.NoTPM {
		return "", nil
	}
	var err error
	stateDir := o.TPMStateDir
	if stateDir == "" {
		if stateDir, err = os.MkdirTemp("", "pvm-tpm"); err != nil {
			return "", fmt.Errorf("launch: %w", err)
		}
		n.tpmTemp = stateDir
	}
	tpmSock := filepath.Join(n.sockDir, "tpm.sock")
	n.tpm, err = startSwtpm(ctx, stateDir, tpmSock, filepath.Join(o.WorkDir, "swtpm.log"))
	if err != nil {
		return "", fmt.Errorf("launch: node %s: %w", o.Name, err)
	}
	return tpmSock, nil
}

// startQEMU starts QEMU with the console on the node's sink.
func (n *Node) startQEMU(tpmSock string) error {
	kvm := KVMAvailable()
	var tscKHz uint64
	if !kvm {
		tscKHz = hostTSCkHz()
	}
	args := qemuArgs(n.opts, n.qmpPath, tpmSock, kvm, tscKHz)
	// The exact command line, pasteable into a shell, is the first thing
	// one wants when reproducing a failure by hand.
	fmt.Fprintf(n.qemuLog, "# qemu-system-x86_64 %s\n", shellJoin(args))
	cmd := exec.Command("qemu-system-x86_64", args...)
	// With a Writer (not StdoutPipe) as Stdout, cmd.Wait returns only after
	// the console copy hit EOF, so every byte QEMU printed is in n.lines
	// before the node is declared exited.
	cmd.Stdout = consoleSink{n}
	cmd.Stderr = n.qemuLog
	// A harness that dies (test binary timeout panic, ^C) must not leave a
	// TCG guest burning a shared CPU.
	// (Pdeathsig follows the forking OS thread, which Go keeps alive unless
	// the caller exits a goroutine locked with runtime.LockOSThread.)
	// Own process group: a terminal's Ctrl-C must reach only the harness,
	// which turns it into a clean ACPI power-off, not kill QEMU outright.
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL, Setpgid: true}
	// Bounds Wait if something inherited QEMU's stdout and outlives it.
	cmd.WaitDelay = 10 * time.Second
	if err := cmd.Start(); err != nil {
		return fmt.Errorf("launch: node %s: starting qemu: %w", n.opts.Name, err)
	}
	n.cmd = cmd
	return nil
}

func (n *Node) reap() {
	err := n.cmd.Wait()
	n.mu.Lock()
	// EOF ends the last line too: nothing can complete it any more.
	if len(n.partial) > 0 {
		n.lines = append(n.lines, strings.ReplaceAll(string(n.partial), "\r", ""))
		n.partial = nil
	}
	n.mu.Unlock()
	if err != nil {
		err = fmt.Errorf("node %s: qemu: %w%s", n.opts.Name, err, fileTail(n.qemuLog.Name(), 10))
	}
	n.exitErr = err
	close(n.exited)
}

func prepareDisk(path string, size int64) error {
	if path == "" {
		return nil
	}
	if _, err := os.Stat(path); err == nil {
		return nil
	} else if !errors.Is(err, os.ErrNotExist) {
		return err
	}
	if size <= 0 {
		return fmt.Errorf("disk %s does not exist and DiskSizeBytes is 0", path)
	}
	f, err := os.OpenFile(path, os.O_RDWR|os.O_CREATE|os.O_EXCL, 0o644)
	if err != nil {
		return err
	}
	// Truncate leaves a hole, so a multi-GiB disk costs nothing until written.
	if err := f.Truncate(size); err != nil {
		f.Close()
		os.Remove(path)
		return err
	}
	return f.Close()
}

// shortTempDir makes the directory for unix sockets, whose paths must stay
// under the kernel's 108-byte sun_path limit even with a long $TMPDIR.
func shortTempDir() (string, error) {
	d, err := os.MkdirTemp("", "pvm")
	if err == nil && len(d)+len("/qmp.sock") < 100 {
		return d, nil
	}
	if err == nil {
		os.Remove(d)
	}
	d, err = os.MkdirTemp("/tmp", "pvm")
	if err != nil {
		return "", fmt.Errorf("launch: socket dir: %w", err)
	}
	return d, nil
}

// qemuOpt escapes a value for QEMU's comma-separated option syntax, where
// a literal comma must be doubled.
func qemuOpt(s string) string { return strings.ReplaceAll(s, ",", ",,") }

// qemuArgs is QEMU's command line for node o. tscKHz, if not 0, is the
// guest's TSC rate under TCG, handed to a kernel booted directly as
// tsc_early_khz: QEMU gives a TCG guest the host's counter for RDTSC, and
// the kernel's own calibration (the TSC against the emulated PIT and
// HPET over a few milliseconds) goes wrong when the host deschedules the
// vCPU in the middle: measured, a worker that booted beside three busy
// VMs on two cores ran its clock 8.7 times too fast, with tsc=reliable
// (board/qemu.go) nothing to correct it: its pods found their service
// account tokens expired moments after the controller issued them.
// Under load the calibration is also off by some 0.05 % when it works
// (40 s a day). A kernel booted by the firmware (UEFI) keeps its
// image's command line, and calibrates.
func qemuArgs(o NodeOptions, qmpPath, tpmSock string, kvm bool, tscKHz uint64) []string {
	args := []string{
		"-machine", "q35",
		"-m", strconv.Itoa(o.MemoryMiB),
		"-smp", strconv.Itoa(o.CPUs),
		"-display", "none",
		"-no-reboot",
		"-serial", "stdio",
		"-monitor", "none",
		"-qmp", "unix:" + qemuOpt(qmpPath) + ",server=on,wait=off",
	}
	if kvm {
		args = append(args, "-accel", "kvm", "-cpu", "host")
	} else {
		args = append(args, "-accel", "tcg", "-cpu", "max")
	}
	if u := o.UEFI; u != nil {
		code := u.Code
		if code == "" {
			code = OVMFCode
		}
		args = append(args,
			"-drive", "if=pflash,format=raw,unit=0,readonly=on,file="+qemuOpt(code),
			"-drive", "if=pflash,format=raw,unit=1,file="+qemuOpt(u.Vars))
	}
	if o.Kernel != "" {
		args = append(args, "-kernel", o.Kernel)
	}
	if o.Initramfs != "" {
		args = append(args, "-initrd", o.Initramfs)
	}
	cmdline := o.Cmdline
	if o.Kernel != "" && tscKHz != 0 {
		cmdline = strings.TrimSpace(cmdline + " tsc_early_khz=" + strconv.FormatUint(tscKHz, 10))
	}
	if cmdline != "" {
		args = append(args, "-append", cmdline)
	}
	args = append(args, "-device", "virtio-rng-pci")
	// -device (not -drive if=virtio, whose devices QEMU adds after every
	// -device) so that the disks take PCI slots in this order.
	for i, d := range o.disks() {
		id := fmt.Sprintf("disk%d", i)
		dev := "virtio-blk-pci,drive=" + id
		if o.PC != nil && o.PC.SATA {
			// ich9-ahci's six ports are buses ide.0 to ide.5.
			dev = fmt.Sprintf("ide-hd,drive=%s,bus=ide.%d", id, i)
		}
		if d.Serial != "" {
			dev += ",serial=" + qemuOpt(d.Serial)
		}
		args = append(args, "-drive", "if=none,id="+id+",format=raw,cache=unsafe,file="+qemuOpt(d.Path), "-device", dev)
	}
	if tpmSock != "" {
		args = append(args,
			"-chardev", "socket,id=chrtpm,path="+qemuOpt(tpmSock),
			"-tpmdev", "emulator,id=tpm0,chardev=chrtpm",
			"-device", "tpm-tis,tpmdev=tpm0")
	}
	names := make([]string, 0, len(o.FwCfg))
	for name := range o.FwCfg {
		names = append(names, name)
	}
	sort.Strings(names) // a stable command line makes qemu.log diffable
	for _, name := range names {
		args = append(args, "-fw_cfg", "name="+qemuOpt(name)+",file="+qemuOpt(o.FwCfg[name]))
	}
	if o.NoNetwork {
		// Without this QEMU adds its default NIC.
		args = append(args, "-nic", "none")
	} else {
		netdev := "user,id=net0"
		for _, f := range o.HostForwards {
			netdev += fmt.Sprintf(",hostfwd=tcp:127.0.0.1:%d-:%d", f.HostPort, f.GuestPort)
		}
		nic := "virtio-net-pci"
		if o.PC != nil && o.PC.NIC != "" {
			nic = o.PC.NIC
		}
		args = append(args, "-netdev", netdev, "-device", nic+",netdev=net0")
	}
	if o.PC != nil && o.PC.USBKeyboard {
		args = append(args, "-device", "qemu-xhci,id=xhci", "-device", "usb-kbd,bus=xhci.0")
	}
	return append(args, o.ExtraArgs...)
}

var shellSafe = regexp.MustCompile(`^[A-Za-z0-9_/.,:=@%+-]+$`)

func shellJoin(args []string) string {
	q := make([]string, len(args))
	for i, a := range args {
		if shellSafe.MatchString(a) {
			q[i] = a
		} else {
			q[i] = "'" + strings.ReplaceAll(a, "'", `'\''`) + "'"
		}
	}
	return strings.Join(q, " ")
}

// consoleSink receives QEMU's stdout (the serial port).
type consoleSink struct{ n *Node }

func (s consoleSink) Write(p []byte) (int, error) {
	n, total := s.n, len(p)
	if !n.hasSpoken && total > 0 && n.spoke != nil {
		n.hasSpoken = true
		close(n.spoke)
	}
	// The log on disk is the evidence a failed test leaves behind, so it is
	// written first and its errors are not allowed to stall the guest.
	n.consoleLog.Write(p)
	// Write is only ever called from exec's single copying goroutine, so
	// n.extra needs no lock, and a slow Console cannot block Lines().
	if n.extra != nil {
		if _, err := n.extra.Write(p); err != nil {
			n.extra = nil
		}
	}
	n.mu.Lock()
	defer n.mu.Unlock()
	added := false
	for len(p) > 0 {
		i := bytes.IndexByte(p, '\n')
		if i < 0 {
			n.partial = append(n.partial, p...)
			break
		}
		line := append(n.partial, p[:i]...)
		n.partial = nil
		n.lines = append(n.lines, strings.ReplaceAll(string(line), "\r", ""))
		added = true
		p = p[i+1:]
	}
	if added {
		close(n.changed)
		n.changed = make(chan struct{})
	}
	return total, nil
}

// Lines returns a snapshot of the complete console lines so far, with
// carriage returns removed.
func (n *Node) Lines() []string {
	n.mu.Lock()
	defer n.mu.Unlock()
	return append([]string(nil), n.lines...)
}

// TPMProcess is the node's swtpm process while it runs (nil with NoTPM,
// or once it exited): swtpm follows QEMU's lifetime, a power cut's
// included.
func (n *Node) TPMProcess() *os.Process {
	if n.tpm == nil {
		return nil
	}
	select {
	case <-n.tpm.done:
		return nil
	default:
		return n.tpm.cmd.Process
	}
}

// SocketDir is the short temporary directory of the node's QMP and TPM
// sockets, removed by Close.
func (n *Node) SocketDir() string { return n.sockDir }

// WorkDir is the directory of this boot's logs (console, QEMU, swtpm).
func (n *Node) WorkDir() string { return n.opts.WorkDir }

// ConsolePath is the raw serial log, kept for post-mortems.
func (n *Node) ConsolePath() string { return filepath.Join(n.opts.WorkDir, "console.log") }

// Exited is closed once QEMU has exited and its console is fully read.
func (n *Node) Exited() <-chan struct{} { return n.exited }

// WaitForLine returns the submatches of the first console line since boot
// that matches re. Lines printed before the call count, so callers need no
// cursor for a one-shot check.
func (n *Node) WaitForLine(ctx context.Context, re *regexp.Regexp) ([]string, error) {
	m, _, err := n.WaitForLineAfter(ctx, 0, re)
	return m, err
}

// WaitForLineAfter is WaitForLine restricted to lines with index >= cursor;
// it also returns the matched line's index, so that cursor+1 can be used to
// wait for the next event (e.g. the second boot's banner after a reboot).
func (n *Node) WaitForLineAfter(ctx context.Context, cursor int, re *regexp.Regexp) ([]string, int, error) {
	if cursor < 0 {
		cursor = 0
	}
	for {
		// exited is sampled before scanning: if it was already closed, the
		// scan saw every line QEMU will ever print.
		var done bool
		select {
		case <-n.exited:
			done = true
		default:
		}
		n.mu.Lock()
		for ; cursor < len(n.lines); cursor++ {
			if m := re.FindStringSubmatch(n.lines[cursor]); m != nil {
				n.mu.Unlock()
				return m, cursor, nil
			}
		}
		changed := n.changed
		n.mu.Unlock()
		if done {
			var qlog string
			if n.exitErr != nil {
				qlog = fileTail(n.qemuLog.Name(), 10)
			}
			return nil, -1, fmt.Errorf("node %s: %w (%s) before a console line matched %q; last console lines:\n%s%s",
				n.opts.Name, ErrExited, n.ExitStatus(), re, n.Tail(), qlog)
		}
		select {
		case <-changed:
		case <-n.exited:
		case <-ctx.Done():
			return nil, -1, fmt.Errorf("node %s: waiting for console line matching %q: %w (qemu %s); last console lines:\n%s",
				n.opts.Name, re, ctx.Err(), n.ExitStatus(), n.Tail())
		}
	}
}

// ExitStatus says how QEMU ended ("still running" while it runs).
func (n *Node) ExitStatus() string {
	select {
	case <-n.exited:
	default:
		return "still running"
	}
	if n.exitErr == nil {
		return "exit status 0"
	}
	var ee *exec.ExitError
	if errors.As(n.exitErr, &ee) {
		return ee.ProcessState.String()
	}
	return n.exitErr.Error()
}

// Tail formats the last console lines, including an unterminated one,
// because the line a guest died in the middle of is often the interesting one.
func (n *Node) Tail() string {
	n.mu.Lock()
	defer n.mu.Unlock()
	lines := n.lines
	if len(lines) > tailLines {
		lines = lines[len(lines)-tailLines:]
	}
	var b strings.Builder
	for _, l := range lines {
		b.WriteString("  | " + l + "\n")
	}
	if len(n.partial) > 0 {
		b.WriteString("  | " + strings.ReplaceAll(string(n.partial), "\r", "") + "⏎(no newline yet)\n")
	}
	if b.Len() == 0 {
		b.WriteString("  (console empty)\n")
	}
	return b.String()
}

// fileTail returns the last lines of a small log file, formatted for
// appending to an error; qemu's reason for refusing to start lives there.
func fileTail(path string, max int) string {
	b, err := os.ReadFile(path)
	if err != nil || len(bytes.TrimSpace(b)) == 0 {
		return ""
	}
	lines := strings.Split(strings.TrimRight(string(b), "\n"), "\n")
	if len(lines) > max {
		lines = lines[len(lines)-max:]
	}
	return "; " + filepath.Base(path) + ":\n  | " + strings.Join(lines, "\n  | ")
}

// Wait waits for QEMU to exit and returns nil if it exited with status 0
// (which is also what a guest reboot gives, because of -no-reboot).
func (n *Node) Wait(ctx context.Context) error {
	select {
	case <-n.exited:
		return n.exitErr
	case <-ctx.Done():
		return fmt.Errorf("node %s: waiting for qemu to exit: %w", n.opts.Name, ctx.Err())
	}
}

// HostCPUSeconds is the CPU time QEMU has used on the host so far (user
// and system, every vCPU and I/O thread): under TCG, what the guest's
// work costs the machine the tests share.
func (n *Node) HostCPUSeconds() (float64, error) {
	u, err := supervisor.ProcessUsage(n.cmd.Process.Pid)
	if err != nil {
		return 0, fmt.Errorf("node %s: %w", n.opts.Name, err)
	}
	return u.CPUSeconds, nil
}

// Kill SIGKILLs QEMU, which is as close to pulling the plug as it gets:
// the guest gets no chance to flush anything. swtpm follows on its own.
func (n *Node) Kill() error {
	select {
	case <-n.exited:
		return nil
	default:
	}
	if err := n.cmd.Process.Kill(); err != nil && !errors.Is(err, os.ErrProcessDone) {
		return fmt.Errorf("node %s: %w", n.opts.Name, err)
	}
	return nil
}

// Close kills whatever is still running and removes temporary state. It is
// idempotent and safe to register with t.Cleanup next to explicit calls.
func (n *Node) Close() error {
	n.closeOnce.Do(func() {
		var errs []error
		if n.cmd != nil {
			errs = append(errs, n.Kill())
			// Close must not return while QEMU may still write to the logs.
			<-n.exited
		}
		errs = append(errs, n.cleanup())
		n.closeErr = errors.Join(errs...)
	})
	return n.closeErr
}

// cleanup tears down everything but QEMU.
func (n *Node) cleanup() error {
	var errs []error
	if n.tpm != nil {
		// Grace only if QEMU ran: only then will swtpm exit by itself.
		errs = append(errs, n.tpm.stop(n.cmd != nil))
	}
	if n.tpmTemp != "" {
		errs = append(errs, os.RemoveAll(n.tpmTemp))
	}
	if n.sockDir != "" {
		errs = append(errs, os.RemoveAll(n.sockDir))
	}
	for _, f := range []*os.File{n.consoleLog, n.qemuLog} {
		if f != nil {
			f.Close()
		}
	}
	return errors.Join(errs...)
}
