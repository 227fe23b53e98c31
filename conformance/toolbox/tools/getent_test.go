package tools

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

func TestGetent(t *testing.T) {
	dir := t.TempDir()
	files := map[*string]string{
		&passwdPath: "root:x:0:0:root:/root:/bin/sh\n# a comment\n\nuser:x:1000:1000::/home/user:/bin/sh\n",
		&groupPath:  "root:x:0:\nusers:x:100:user\ngroup-defined-in-image:x:50000:user\n",
		&hostsPath:  "# comment\n127.0.0.1\tlocalhost\n10.0.0.5 pod-1.sub.ns.svc.cluster.local pod-1 # k8s\n",
	}
	for p, content := range files {
		old := *p
		*p = filepath.Join(dir, filepath.Base(old))
		t.Cleanup(func() { *p = old })
		if err := os.WriteFile(*p, []byte(content), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	root := "root:x:0:0:root:/root:/bin/sh\n"
	user := "user:x:1000:1000::/home/user:/bin/sh\n"
	for _, tc := range []struct {
		args []string
		want result
	}{
		{[]string{"passwd"}, result{root + user, "", 0}},
		{[]string{"passwd", "user"}, result{user, "", 0}},
		{[]string{"passwd", "1000"}, result{user, "", 0}},
		{[]string{"passwd", "0", "user"}, result{root + user, "", 0}},
		{[]string{"passwd", "nobody"}, result{"", "", 2}},
		{[]string{"passwd", "root", "65534"}, result{root, "", 2}},
		{[]string{"group"}, result{"root:x:0:\nusers:x:100:user\ngroup-defined-in-image:x:50000:user\n", "", 0}},
		{[]string{"group", "50000"}, result{"group-defined-in-image:x:50000:user\n", "", 0}},
		{[]string{"group", "users"}, result{"users:x:100:user\n", "", 0}},
		{[]string{"group", "user"}, result{"", "", 2}},
		{[]string{"hosts"}, result{"127.0.0.1       localhost\n10.0.0.5        pod-1.sub.ns.svc.cluster.local pod-1\n", "", 0}},
		{[]string{"hosts", "bad..host"}, result{"", "", 2}},
		{[]string{"ahosts"}, result{"", "Enumeration not supported on ahosts\n", 3}},
		{[]string{"shadow"}, result{"", "Unknown database: shadow\n", 1}},
		{nil, result{"", "usage: getent hosts|ahosts|ahostsv4|ahostsv6|passwd|group [key ...]\n", 1}},
	} {
		check(t, run(getentMain, "", append([]string{"getent"}, tc.args...)...), tc.want)
	}
}

// The system's own hosts file: Go's resolver reads /etc/hosts itself.
func TestGetentLocalhost(t *testing.T) {
	got := run(getentMain, "", "getent", "hosts", "localhost")
	if got.code != 0 || got.stderr != "" || !strings.Contains(got.stdout, "127.0.0.1       localhost\n") {
		t.Errorf("getent hosts localhost: %+v", got)
	}
	got = run(getentMain, "", "getent", "ahostsv4", "localhost")
	if got.code != 0 || got.stdout != "127.0.0.1       STREAM localhost\n127.0.0.1       DGRAM  \n127.0.0.1       RAW    \n" {
		t.Errorf("getent ahostsv4 localhost: %+v", got)
	}
	got = run(getentMain, "", "getent", "hosts", "127.0.0.1")
	if got.code != 0 || !strings.HasPrefix(got.stdout, "127.0.0.1       localhost") {
		t.Errorf("getent hosts 127.0.0.1: %+v", got)
	}
	want := run(getentMain, "", "getent", "hosts", "localhost").stdout
	check(t, run(getentMain, "", "getent", "hosts", "localhost", "bad..host"), result{want, "", 2})
}
