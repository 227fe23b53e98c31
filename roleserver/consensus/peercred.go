package consensus

import (
	"errors"
	"fmt"
	"log/slog"
	"net"
	"os"
	"strconv"
	"strings"

	"golang.org/x/sys/unix"
)

// listenUnixFor listens on a unix socket at path (replacing whatever file
// is there) that only processes running as uid may use: the file is
// uid's with mode 0600, which keeps other unprivileged users out, and
// peerUIDListener closes connections of any other UID, root's and those
// of processes with CAP_DAC_OVERRIDE included.
func listenUnixFor(path string, uid int, log *slog.Logger) (net.Listener, error) {
	if err := os.Remove(path); err != nil && !errors.Is(err, os.ErrNotExist) {
		return nil, err
	}
	lis, err := net.Listen("unix", path)
	if err != nil {
		return nil, err
	}
	if err := os.Chmod(path, 0o600); err != nil {
		lis.Close()
		return nil, err
	}
	if err := os.Chown(path, uid, -1); err != nil {
		lis.Close()
		return nil, err
	}
	return &peerUIDListener{Listener: lis, uid: uid, log: log}, nil
}

// peerUIDListener accepts only connections whose peer (SO_PEERCRED: the
// process that connected, as of connect(2)) runs as uid, in the core's
// own cgroup. The others are closed at once and logged; Accept goes on
// with the next connection, so that gRPC's server does not stop serving.
type peerUIDListener struct {
	net.Listener
	uid int
	log *slog.Logger
	// cgroup reads a process's /proc/PID/cgroup ("self": this one's); nil
	// is procCgroup. Only a test that cannot put a process into another
	// cgroup (no writable cgroup2) sets it, to try the refusal anyway.
	cgroup func(pid string) ([]byte, error)
}

func (l *peerUIDListener) Accept() (net.Conn, error) {
	for {
		c, err := l.Listener.Accept()
		if err != nil {
			return nil, err
		}
		cred, err := peerCred(c)
		switch {
		case err != nil:
			l.log.Warn("refusing a connection whose peer credentials are unknown", "err", err)
		case int(cred.Uid) != l.uid:
			l.log.Warn("refusing a connection from another UID", "uid", cred.Uid, "pid", cred.Pid, "want-uid", l.uid)
		default:
			if err := sameCgroup(l.cgroup, int(cred.Pid)); err != nil {
				// The UID alone is not enough: a container may run
				// with any number, but never in the core's cgroup.
				l.log.Warn("refusing a connection from outside the core's cgroup", "uid", cred.Uid, "pid", cred.Pid, "err", err)
				break
			}
			return c, nil
		}
		c.Close()
	}
}

// peerCred returns the credentials of the process at the other end of a
// unix socket connection.
func peerCred(c net.Conn) (*unix.Ucred, error) {
	uc, ok := c.(*net.UnixConn)
	if !ok {
		return nil, fmt.Errorf("not a unix socket connection: %T", c)
	}
	raw, err := uc.SyscallConn()
	if err != nil {
		return nil, err
	}
	var cred *unix.Ucred
	var credErr error
	if err := raw.Control(func(fd uintptr) {
		cred, credErr = unix.GetsockoptUcred(int(fd), unix.SOL_SOCKET, unix.SO_PEERCRED)
	}); err != nil {
		return nil, err
	}
	if credErr != nil {
		return nil, fmt.Errorf("SO_PEERCRED: %w", credErr)
	}
	return cred, nil
}

// sameCgroup checks that process pid is in this process's cgroup (v2,
// /proc/PID/cgroup, read with read or procCgroup if nil): the core's
// children are (the supervisor starts them there), a container never is
// (the OCI runtime puts it in its pod's).
func sameCgroup(read func(pid string) ([]byte, error), pid int) error {
	if read == nil {
		read = procCgroup
	}
	self, err := read("self")
	if err != nil {
		return err
	}
	peer, err := read(strconv.Itoa(pid))
	if err != nil {
		return err
	}
	if string(peer) != string(self) {
		return fmt.Errorf("in cgroup %q, not %q", strings.TrimSpace(string(peer)), strings.TrimSpace(string(self)))
	}
	return nil
}

// procCgroup reads /proc/PID/cgroup.
func procCgroup(pid string) ([]byte, error) {
	return os.ReadFile("/proc/" + pid + "/cgroup")
}
