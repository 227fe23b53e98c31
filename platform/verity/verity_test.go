package verity

import (
	"bytes"
	"crypto/rand"
	"encoding/hex"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
)

// TestMatchesVeritysetup checks the tree against cryptsetup's independent
// implementation for sizes that need one, two and three levels.
func TestMatchesVeritysetup(t *testing.T) {
	if _, err := exec.LookPath("veritysetup"); err != nil {
		t.Fatal("veritysetup missing: run scripts/install-deps (package cryptsetup-bin)")
	}
	salt := bytes.Repeat([]byte{0xab}, 32)
	for _, blocks := range []int{2, 128, 129, 16385} {
		dir := t.TempDir()
		data := make([]byte, blocks*BlockSize)
		rand.Read(data)
		img := filepath.Join(dir, "img")
		if err := os.WriteFile(img, data, 0o644); err != nil {
			t.Fatal(err)
		}
		f, err := os.OpenFile(img, os.O_RDWR, 0)
		if err != nil {
			t.Fatal(err)
		}
		p, err := AppendTree(f, int64(len(data)), salt)
		f.Close()
		if err != nil {
			t.Fatal(err)
		}
		ref := filepath.Join(dir, "ref")
		os.WriteFile(ref, data, 0o644)
		out, err := exec.Command("veritysetup", "format", "--no-superblock", "--salt", hex.EncodeToString(salt),
			"--hash-offset", strconv.Itoa(len(data)), "--data-blocks", strconv.Itoa(blocks), ref, ref).CombinedOutput()
		if err != nil {
			t.Fatalf("veritysetup: %v\n%s", err, out)
		}
		var want string
		for _, l := range strings.Split(string(out), "\n") {
			if k, v, ok := strings.Cut(l, ":"); ok && strings.TrimSpace(k) == "Root hash" {
				want = strings.TrimSpace(v)
			}
		}
		if got := hex.EncodeToString(p.RootHash); got != want {
			t.Errorf("%d blocks: root hash %s, veritysetup says %s", blocks, got, want)
		}
		a, _ := os.ReadFile(img)
		b, _ := os.ReadFile(ref)
		if !bytes.Equal(a, b) {
			t.Errorf("%d blocks: hash tree bytes differ from veritysetup's", blocks)
		}
		// HoldsTree finds the image by its top hash block, and not with
		// that block changed or another salt.
		if !HoldsTree(bytes.NewReader(a), p) {
			t.Errorf("%d blocks: HoldsTree misses the image", blocks)
		}
		a[p.HashStartBlock*BlockSize+5] ^= 1
		other := p
		other.Salt = []byte{1}
		if HoldsTree(bytes.NewReader(a), p) || HoldsTree(bytes.NewReader(b), other) {
			t.Errorf("%d blocks: HoldsTree accepts a changed tree or salt", blocks)
		}
	}
}

func TestParamsRoundTrip(t *testing.T) {
	p := Params{DataBlocks: 100, HashStartBlock: 100, Salt: []byte{1, 2}, RootHash: bytes.Repeat([]byte{7}, 32)}
	q, err := ParseParams(p.String())
	if err != nil || q.String() != p.String() {
		t.Fatalf("round trip: %v %v", q, err)
	}
	if tab := p.Table("7:0"); !strings.HasPrefix(tab, "0 800 verity 1 7:0 7:0 4096 4096 100 100 sha256 0707") {
		t.Errorf("table %q", tab)
	}
	for _, bad := range []string{"", "v2,sha256,4096,1,1,00,00", "v1,sha256,4096,10,5,00," + hex.EncodeToString(p.RootHash),
		"v1,sha256,4096,10,10,zz," + hex.EncodeToString(p.RootHash), "v1,sha256,4096,10,10,00,abcd"} {
		if _, err := ParseParams(bad); err == nil {
			t.Errorf("accepted %q", bad)
		}
	}
}
