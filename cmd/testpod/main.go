// Command testpod is the only program in the container images a Plinth
// node carries: the pod sandbox ("pause") image and the test image the VM
// tests run workloads from. Nodes have no registry to pull from, so the
// image builder writes both images as OCI archives into the system image,
// each holding just this one static binary.
//
//	testpod pause               sleep until SIGTERM/SIGINT; reap children as PID 1
//	testpod serve [-port 8080]  HTTP: / answers "hello from <hostname>", /healthz "ok"
//	testpod print TEXT...       print TEXT and exit 0
//	testpod cat FILE...         print the files (e.g. /proc/1/status: its Seccomp line)
//	testpod write FILE TEXT     write TEXT to FILE (synced)
//	testpod fill FILE BYTES     write BYTES zero bytes to FILE (synced), or say which
//	                            error stopped it (a volume's quota: EDQUOT or ENOSPC)
//	testpod link TARGET NAME    make NAME a symbolic link to TARGET
//	testpod setproject FILE ID  make FILE and set its project ID (FS_IOC_FSSETXATTR,
//	                            `chattr -p ID`): how a file leaves a project quota
//	testpod dns NAME            resolve NAME, print its addresses (non-zero exit on failure)
//	testpod api                 GET this namespace's pods from the Kubernetes API with
//	                            the pod's service account (exit 0 only on HTTP 200)
//	testpod selftest            dns kubernetes.default.svc.cluster.local + api
//	testpod get URL             HTTP GET, print the body (exit 0 only on HTTP 200)
//	testpod spin                keep one CPU busy until SIGTERM/SIGINT (load for an autoscaler)
//
// Why one program for everything: one small binary (no shell, no libc)
// keeps the images tiny and reproducible, and every behaviour a test
// needs is Go code that is unit-tested here. The API check uses plain
// net/http and crypto/tls, not client-go, to stay a few MiB.
package main

import (
	"errors"
	"fmt"
	"io"
	"os"
	"os/signal"
	"runtime"
	"sort"
	"strconv"
	"strings"
	"unsafe"

	"golang.org/x/sys/unix"
)

// command is one subcommand: it gets its arguments and returns the exit
// code.
type command struct {
	usage string
	run   func(args []string, stdout, stderr io.Writer) int
}

var commands = map[string]command{
	"pause": {"pause", func(_ []string, _, _ io.Writer) int {
		sigs := make(chan os.Signal, 8)
		signal.Notify(sigs, unix.SIGTERM, unix.SIGINT, unix.SIGCHLD)
		return pause(sigs, os.Getpid() == 1, reapChildren)
	}},
	"serve":      {"serve [-port 8080]", serveCmd},
	"print":      {"print TEXT...", printCmd},
	"cat":        {"cat FILE...", catCmd},
	"write":      {"write FILE TEXT", writeCmd},
	"fill":       {"fill FILE BYTES", fillCmd},
	"setproject": {"setproject FILE ID", setProjectCmd},
	"link": {"link TARGET NAME", func(args []string, stdout, stderr io.Writer) int {
		if len(args) != 2 {
			fmt.Fprintln(stderr, "usage: testpod link TARGET NAME")
			return 2
		}
		if err := os.Symlink(args[0], args[1]); err != nil {
			fmt.Fprintln(stderr, "testpod:", err)
			return 1
		}
		fmt.Fprintf(stdout, "%s -> %s\n", args[1], args[0])
		return 0
	}},
	"dns":      {"dns [-timeout 10s] NAME", dnsCmd},
	"api":      {"api [-server URL] [-account DIR] [-timeout 10s]", apiCmd},
	"selftest": {"selftest", selftestCmd},
	"get":      {"get [-timeout 10s] URL", getCmd},
	"spin": {"spin", func(_ []string, _, _ io.Writer) int {
		sigs := make(chan os.Signal, 1)
		signal.Notify(sigs, unix.SIGTERM, unix.SIGINT)
		return spin(sigs)
	}},
}

// spin keeps one CPU busy until stop says so (a container's PID 1 has
// no default action for SIGTERM: it must exit on its own).
func spin(stop <-chan os.Signal) int {
	for {
		select {
		case <-stop:
			return 0
		//lint:ignore SA5004 the spin is the point: it keeps one CPU busy
		default:
		}
	}
}

// The main goroutine keeps the main thread, the task /proc/self names:
// the kernel lets only a task itself read some of its files
// (timerslack_ns: another needs CAP_SYS_NICE), and Go would otherwise
// run a read on whichever thread is free. Guarded by
// TestKubernetesTwoNodes (the timer slack of a pod's process).
func init() { runtime.LockOSThread() }

func main() {
	os.Exit(run(os.Args[1:], os.Stdout, os.Stderr))
}

func run(args []string, stdout, stderr io.Writer) int {
	if len(args) == 0 {
		return usage(stderr)
	}
	c, ok := commands[args[0]]
	if !ok {
		fmt.Fprintf(stderr, "testpod: unknown command %q\n", args[0])
		return usage(stderr)
	}
	return c.run(args[1:], stdout, stderr)
}

func usage(w io.Writer) int {
	var names []string
	for n := range commands {
		names = append(names, n)
	}
	sort.Strings(names)
	fmt.Fprintln(w, "usage: testpod COMMAND [ARGS]")
	for _, n := range names {
		fmt.Fprintln(w, "  testpod "+commands[n].usage)
	}
	return 2
}

func printCmd(args []string, stdout, _ io.Writer) int {
	fmt.Fprintln(stdout, strings.Join(args, " "))
	return 0
}

func catCmd(args []string, stdout, stderr io.Writer) int {
	for _, name := range args {
		b, err := os.ReadFile(name)
		if err != nil {
			fmt.Fprintln(stderr, "testpod:", err)
			return 1
		}
		stdout.Write(b)
	}
	return 0
}

func writeCmd(args []string, stdout, stderr io.Writer) int {
	if len(args) != 2 {
		fmt.Fprintln(stderr, "usage: testpod write FILE TEXT")
		return 2
	}
	return writeFile(args[0], strings.NewReader(args[1]), stdout, stderr)
}

func fillCmd(args []string, stdout, stderr io.Writer) int {
	var n int64
	err := errors.New("no size")
	if len(args) == 2 {
		n, err = strconv.ParseInt(args[1], 10, 64)
	}
	if err != nil || n < 0 {
		fmt.Fprintln(stderr, "usage: testpod fill FILE BYTES")
		return 2
	}
	return writeFile(args[0], io.LimitReader(zeros{}, n), stdout, stderr)
}

// fsxattr is struct fsxattr (linux/fs.h).
type fsxattr struct {
	Xflags, Extsize, Nextents, Projid, Cowextsize uint32
	Pad                                           [8]byte
}

// FS_IOC_FSGETXATTR and FS_IOC_FSSETXATTR (linux/fs.h).
const (
	fsIocFSGetXattr = 0x801c581f
	fsIocFSSetXattr = 0x401c5820
)

func setProjectCmd(args []string, stdout, stderr io.Writer) int {
	var id uint64
	err := errors.New("no ID")
	if len(args) == 2 {
		id, err = strconv.ParseUint(args[1], 10, 32)
	}
	if err != nil {
		fmt.Fprintln(stderr, "usage: testpod setproject FILE ID")
		return 2
	}
	f, err := os.OpenFile(args[0], os.O_RDWR|os.O_CREATE, 0o644)
	if err != nil {
		fmt.Fprintln(stderr, "testpod:", err)
		return 1
	}
	defer f.Close()
	var a fsxattr
	if _, _, e := unix.Syscall(unix.SYS_IOCTL, f.Fd(), fsIocFSGetXattr, uintptr(unsafe.Pointer(&a))); e != 0 {
		fmt.Fprintf(stderr, "testpod: FS_IOC_FSGETXATTR: %v (%s)\n", e, unix.ErrnoName(e))
		return 1
	}
	was := a.Projid
	a.Projid = uint32(id)
	if _, _, e := unix.Syscall(unix.SYS_IOCTL, f.Fd(), fsIocFSSetXattr, uintptr(unsafe.Pointer(&a))); e != 0 {
		fmt.Fprintf(stderr, "testpod: FS_IOC_FSSETXATTR: %v (%s)\n", e, unix.ErrnoName(e))
		return 1
	}
	fmt.Fprintf(stdout, "project of %s: %d, was %d\n", args[0], id, was)
	return 0
}

// writeFile writes r to name and syncs it, saying how much it wrote and,
// if it stopped early, the errno that stopped it by name.
func writeFile(name string, r io.Reader, stdout, stderr io.Writer) int {
	f, err := os.Create(name)
	if err != nil {
		fmt.Fprintln(stderr, "testpod:", err)
		return 1
	}
	n, err := io.Copy(f, r)
	if err == nil {
		err = f.Sync()
	}
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		var errno unix.Errno
		name := "?"
		if errors.As(err, &errno) {
			name = unix.ErrnoName(errno)
		}
		fmt.Fprintf(stderr, "testpod: wrote %d bytes, then: %v (%s)\n", n, err, name)
		return 1
	}
	fmt.Fprintf(stdout, "wrote %d bytes\n", n)
	return 0
}

// zeros reads as endless zero bytes.
type zeros struct{}

func (zeros) Read(p []byte) (int, error) {
	clear(p)
	return len(p), nil
}

// pause waits for SIGTERM or SIGINT (exit 0), as the pod sandbox's
// process must. As PID 1 of its PID namespace it also reaps the children
// that are re-parented to it, on every SIGCHLD.
func pause(sigs <-chan os.Signal, pid1 bool, reap func()) int {
	for sig := range sigs {
		switch sig {
		case unix.SIGCHLD:
			if pid1 {
				reap()
			}
		default:
			return 0
		}
	}
	return 0
}

// reapChildren collects every exited child without blocking.
func reapChildren() {
	for {
		var ws unix.WaitStatus
		pid, err := unix.Wait4(-1, &ws, unix.WNOHANG, nil)
		if pid <= 0 || err != nil {
			return
		}
	}
}
