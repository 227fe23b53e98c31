package consensus

import (
	"context"
	"errors"
	"io"
	"net"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

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
