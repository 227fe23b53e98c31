package consensus

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"plinth.dev/plinth/internal/testutil/cgrouptest"
	"plinth.dev/plinth/platform/logtree"
	"plinth.dev/plinth/platform/supervisor"
)

func logged(lt *logtree.Tree, s string) bool {
	for _, e := range lt.Read("", 1000) {
		if strings.Contains(e.String(), s) {
			return true
		}
	}
	return false
}

// TestPeerUIDListener: a connection from another UID than the listener's
// is closed before anything is read or written on it, and logged; one
// from the right UID gets through.
func TestPeerUIDListener(t *testing.T) {
	lt := logtree.New(100)
	sock := filepath.Join(t.TempDir(), "s.sock")
	// Nobody runs as this UID here: this process is refused.
	lis, err := listenUnixFor(sock, os.Getuid()+1000, lt.Logger("test"))
	if err != nil {
		if errors.Is(err, syscall.EPERM) {
			// chown to another UID needs root; the check itself can
			// still be tried on a listener of our own.
			l, err := net.Listen("unix", sock)
			if err != nil {
				t.Fatal(err)
			}
			lis = &peerUIDListener{Listener: l, uid: os.Getuid() + 1000, log: lt.Logger("test")}
		} else {
			t.Fatal(err)
		}
	}
	defer lis.Close()
	accepted := make(chan net.Conn, 1)
	go func() {
		c, err := lis.Accept()
		if err == nil {
			accepted <- c
		}
	}()
	c, err := net.Dial("unix", sock)
	if err != nil {
		t.Fatal(err)
	}
	c.SetReadDeadline(time.Now().Add(10 * time.Second))
	if _, err := c.Read(make([]byte, 1)); !errors.Is(err, io.EOF) {
		t.Errorf("read on a refused connection: %v, want EOF", err)
	}
	c.Close()
	select {
	case <-accepted:
		t.Error("a connection from another UID was accepted")
	case <-time.After(100 * time.Millisecond):
	}
	if !logged(lt, "refusing a connection from another UID") {
		t.Error("refusal not logged")
	}

	// Our own UID is welcome.
	sock2 := filepath.Join(t.TempDir(), "s.sock")
	lis2, err := listenUnixFor(sock2, os.Getuid(), lt.Logger("test"))
	if err != nil {
		t.Fatal(err)
	}
	defer lis2.Close()
	if fi, err := os.Stat(sock2); err != nil || fi.Mode().Perm() != 0o600 || fi.Sys().(*syscall.Stat_t).Uid != uint32(os.Getuid()) {
		t.Errorf("socket file: %v, %v; want mode 0600, ours", fi.Mode(), err)
	}
	go func() {
		c, err := lis2.Accept()
		if err == nil {
			accepted <- c
		}
	}()
	c2, err := net.Dial("unix", sock2)
	if err != nil {
		t.Fatal(err)
	}
	defer c2.Close()
	select {
	case c := <-accepted:
		c.Close()
	case <-time.After(10 * time.Second):
		t.Error("a connection from the listener's UID was not accepted")
	}
}

// TestKubernetesEndpointOtherUID: the endpoint for another UID (the API
// server's, unprivileged) refuses even root, and says so in the log. It
// needs root, to give the socket to another UID.
func TestKubernetesEndpointOtherUID(t *testing.T) {
	if os.Getuid() != 0 {
		t.Skip("needs root (chown); TestPeerUIDListener covers the check")
	}
	const apiServerUID = 65534
	ctx := ctxTimeout(t, 2*time.Minute)
	a := newMember(t, "node-a")
	a.start(nil)
	st := a.running(time.Minute)

	lt := logtree.New(1000)
	sock := filepath.Join(t.TempDir(), "k8s.sock")
	sctx, cancel := context.WithCancel(ctx)
	sup := supervisor.New(sctx, lt, func(ctx context.Context) error {
		supervisor.Signal(ctx, supervisor.SignalHealthy)
		return st.ServeKubernetes(ctx, sock, apiServerUID)
	}, supervisor.Options{})
	defer sup.Wait()
	defer cancel()
	eventually(t, 10*time.Second, "socket file", func() error {
		fi, err := os.Stat(sock)
		if err != nil {
			return err
		}
		if fi.Sys().(*syscall.Stat_t).Uid != apiServerUID || fi.Mode().Perm() != 0o600 {
			return errors.New("not the API server's, 0600")
		}
		return nil
	})
	if err := dialEtcd(ctx, "unix://"+sock); err == nil {
		t.Error("root reached an endpoint meant for another UID")
	}
	eventually(t, 10*time.Second, "refusal logged", func() error {
		if !logged(lt, "refusing a connection from another UID") {
			return errors.New("not logged")
		}
		return nil
	})
}

// TestPeerCgroupRefused: a connection of the listener's own UID from a
// process outside the core's cgroup (a container's process may run as
// any number, the API server's included) is closed unread, and logged;
// the same program in the core's cgroup gets through. The peer is a real
// process (this test binary, TestPeerCgroupHelper) cloned into a child
// cgroup of this one where cgroup2 is writable; elsewhere the listener
// reads the cgroups from a stand-in that puts the peer into a pod's. It
// needs root, as the confined endpoint's callers are: to make the cgroup.
func TestPeerCgroupRefused(t *testing.T) {
	if os.Getuid() != 0 {
		t.Skip("needs root (a cgroup of its own for the peer); TestPeerUIDListener covers the UID check")
	}
	lt := logtree.New(100)
	sock := filepath.Join(t.TempDir(), "s.sock")
	lis, err := listenUnixFor(sock, os.Getuid(), lt.Logger("test"))
	if err != nil {
		t.Fatal(err)
	}
	defer lis.Close()
	cgroup, _, err := cgrouptest.Child(t, "plinth-peercred")
	if err != nil {
		t.Logf("no cgroup for the peer (%v): the listener reads the peer's from a stand-in", err)
		lis.(*peerUIDListener).cgroup = func(pid string) ([]byte, error) {
			if pid == "self" {
				return []byte("0::/plinth-core\n"), nil
			}
			return []byte("0::/kubepods/pod1/c1\n"), nil
		}
	}
	// Whatever gets through is answered, so that the peer tells an
	// accepted connection (a byte) from a refused one (EOF) at once.
	go func() {
		for {
			c, err := lis.Accept()
			if err != nil {
				return
			}
			c.Write([]byte("x"))
			c.Close()
		}
	}()
	if got := dialFrom(t, sock, cgroup); got != "closed" {
		t.Errorf("a peer of the right UID in another cgroup: connection %s, want closed", got)
	}
	if !logged(lt, "refusing a connection from outside the core's cgroup") {
		t.Error("refusal not logged")
	}
	if cgroup != nil {
		if got := dialFrom(t, sock, nil); got != "open" {
			t.Errorf("the same peer in the core's cgroup: connection %s, want open", got)
		}
	}
}

// dialFrom runs TestPeerCgroupHelper, in cgroup if not nil, against the
// socket sock and returns what became of its connection.
func dialFrom(t *testing.T, sock string, cgroup *os.File) string {
	t.Helper()
	cmd := exec.Command(os.Args[0], "-test.run=^TestPeerCgroupHelper$")
	cmd.Env = append(os.Environ(), peerHelperEnv+"="+sock)
	cmd.Stderr = os.Stderr
	if cgroup != nil {
		cmd.SysProcAttr = &syscall.SysProcAttr{UseCgroupFD: true, CgroupFD: int(cgroup.Fd())}
	}
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("the peer process: %v", err)
	}
	return strings.TrimSpace(string(out))
}

// peerHelperEnv names the socket TestPeerCgroupHelper dials.
const peerHelperEnv = "PLINTH_PEERCRED_TEST_DIAL"

// TestPeerCgroupHelper is TestPeerCgroupRefused's peer process, nothing
// by itself: it dials the socket $PLINTH_PEERCRED_TEST_DIAL names and
// prints "closed" if the other end closed the connection unread, "open"
// if it sent something.
func TestPeerCgroupHelper(t *testing.T) {
	sock := os.Getenv(peerHelperEnv)
	if sock == "" {
		return
	}
	c, err := net.Dial("unix", sock)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(2)
	}
	c.SetReadDeadline(time.Now().Add(10 * time.Second))
	_, err = c.Read(make([]byte, 1))
	switch {
	case errors.Is(err, io.EOF):
		fmt.Println("closed")
	case err == nil:
		fmt.Println("open")
	default:
		fmt.Println(err)
	}
	os.Exit(0)
}
