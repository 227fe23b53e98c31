package kubernetes

import (
	"os"
	"path/filepath"
	"syscall"
	"testing"
)

// TestWriteAsFollowsNoLink: links a component left in its own directory
// where the next write goes (the temporary file, a subdirectory) are
// replaced, never followed: the files they point to keep their content
// and owner.
func TestWriteAsFollowsNoLink(t *testing.T) {
	if os.Getuid() != 0 {
		t.Fatal("needs root (make runs the tests as root) to write as another user")
	}
	dir, outside := filepath.Join(t.TempDir(), "component"), t.TempDir()
	victim := filepath.Join(outside, "victim")
	if err := os.WriteFile(victim, []byte("node state"), 0o600); err != nil {
		t.Fatal(err)
	}
	user := &syscall.Credential{Uid: 10001, Gid: 10001}
	if _, err := (files{"a.json": []byte("one")}).writeAs(dir, user); err != nil {
		t.Fatal(err)
	}
	// What the component plants, as its own user could.
	if err := os.Symlink(victim, filepath.Join(dir, "a.json.new")); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink(outside, filepath.Join(dir, "sub")); err != nil {
		t.Fatal(err)
	}
	paths, err := (files{"a.json": []byte("two"), "sub/b.json": []byte("three")}).writeAs(dir, user)
	if err != nil {
		t.Fatal(err)
	}
	for name, want := range map[string]string{"a.json": "two", "sub/b.json": "three"} {
		b, err := os.ReadFile(paths[name])
		if err != nil || string(b) != want {
			t.Errorf("%s: %q %v, want %q", name, b, err, want)
		}
		var st syscall.Stat_t
		if err := syscall.Lstat(paths[name], &st); err != nil || st.Uid != user.Uid || st.Mode&0o777 != 0o600 {
			t.Errorf("%s: uid %d mode %o %v", name, st.Uid, st.Mode&0o777, err)
		}
	}
	if b, _ := os.ReadFile(victim); string(b) != "node state" {
		t.Errorf("the file a link pointed to: %q", b)
	}
	var st syscall.Stat_t
	if err := syscall.Stat(victim, &st); err != nil || st.Uid != 0 {
		t.Errorf("the file a link pointed to is owned by %d (%v)", st.Uid, err)
	}
	if _, err := os.Stat(filepath.Join(outside, "b.json")); !os.IsNotExist(err) {
		t.Errorf("a file written through the subdirectory link: %v", err)
	}
	if fi, err := os.Lstat(filepath.Join(dir, "sub")); err != nil || !fi.IsDir() {
		t.Errorf("sub: %v %v", fi, err)
	}
}
