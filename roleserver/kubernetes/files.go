package kubernetes

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"syscall"
)

// files are the configuration and credentials one component starts with,
// by file name; written into a directory on the node's tmpfs (never on
// /data: they are generated again at every start).
type files map[string][]byte

// write puts every file into dir (0600; a name may hold a subdirectory),
// replacing what is there, and returns their paths by name.
func (f files) write(dir string) (map[string]string, error) {
	return f.writeAs(dir, nil)
}

// writeAs is write for a component that runs as user: dir (mode 0700)
// and every file in it belong to user, and nobody else but root can read
// them. A nil user is root.
func (f files) writeAs(dir string, user *syscall.Credential) (map[string]string, error) {
	own := func(p string, mode os.FileMode) error {
		if user == nil {
			return nil
		}
		if err := os.Chown(p, int(user.Uid), int(user.Gid)); err != nil {
			return err
		}
		return os.Chmod(p, mode)
	}
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, err
	}
	if err := own(dir, 0o700); err != nil {
		return nil, err
	}
	paths := map[string]string{}
	for name, data := range f {
		p := filepath.Join(dir, name)
		if sub := filepath.Dir(p); sub != dir {
			// The component may have left a link where the subdirectory
			// goes: it is removed, not followed.
			if fi, err := os.Lstat(sub); err == nil && !fi.IsDir() {
				if err := os.Remove(sub); err != nil {
					return nil, err
				}
			}
			if err := os.MkdirAll(sub, 0o700); err != nil {
				return nil, err
			}
			if err := own(sub, 0o700); err != nil {
				return nil, err
			}
		}
		tmp := p + ".new"
		if err := writeNew(tmp, data, user); err != nil {
			return nil, err
		}
		if err := os.Rename(tmp, p); err != nil {
			return nil, err
		}
		paths[name] = p
	}
	return paths, nil
}

// mustJSON marshals what is always marshalable (plain structs and maps).
func mustJSON(v any) []byte {
	b, err := json.MarshalIndent(v, "", "  ")
	if err != nil {
		panic(fmt.Sprintf("kubernetes: %v", err))
	}
	return append(b, '\n')
}

// kubeconfig is a kubeconfig for one client certificate, as the
// Kubernetes components read it (JSON is YAML). server is https://…;
// serverName, if set, is the name the server's certificate is checked
// for (a loopback or load-balanced address is not in its SANs).
func kubeconfig(server, serverName string, caPEM, certPEM, keyPEM []byte) []byte {
	cluster := map[string]any{
		"server":                     server,
		"certificate-authority-data": caPEM,
	}
	if serverName != "" {
		cluster["tls-server-name"] = serverName
	}
	return mustJSON(map[string]any{
		"apiVersion":      "v1",
		"kind":            "Config",
		"clusters":        []any{map[string]any{"name": "plinth", "cluster": cluster}},
		"users":           []any{map[string]any{"name": "plinth", "user": map[string]any{"client-certificate-data": certPEM, "client-key-data": keyPEM}}},
		"contexts":        []any{map[string]any{"name": "plinth", "context": map[string]any{"cluster": "plinth", "user": "plinth"}}},
		"current-context": "plinth",
	})
}

// writeNew writes data into a new file tmp (0600, user's if not nil).
// The directory belongs to the component, which may have left anything
// at tmp: a link there is removed, never followed (O_EXCL|O_NOFOLLOW),
// and the file is chowned through its descriptor. Guarded by
// TestWriteAsFollowsNoLink.
func writeNew(tmp string, data []byte, user *syscall.Credential) error {
	if err := os.Remove(tmp); err != nil && !os.IsNotExist(err) {
		return err
	}
	f, err := os.OpenFile(tmp, os.O_WRONLY|os.O_CREATE|os.O_EXCL|syscall.O_NOFOLLOW, 0o600)
	if err != nil {
		return err
	}
	if user != nil {
		if err := f.Chown(int(user.Uid), int(user.Gid)); err != nil {
			f.Close()
			return err
		}
	}
	if _, err := f.Write(data); err != nil {
		f.Close()
		return err
	}
	return f.Close()
}
