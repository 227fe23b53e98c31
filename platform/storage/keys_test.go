package storage

import (
	"bytes"
	"encoding/hex"
	"strings"
	"testing"

	"plinth.dev/plinth/platform/gpt"
)

// The known answers below were computed independently of Go with this
// Python 3 program, an RFC 5869 HKDF written on the standard hmac module
// (checked against RFC 5869 test case 1) and Python's own uuid module for
// the GPT byte order of the salt:
//
//	import hmac, hashlib, uuid
//	def hkdf(ikm, salt, info, L):
//	    prk = hmac.new(salt, ikm, hashlib.sha256).digest()
//	    t, okm, i = b"", b"", 1
//	    while len(okm) < L:
//	        t = hmac.new(prk, t + info + bytes([i]), hashlib.sha256).digest()
//	        okm += t; i += 1
//	    return okm[:L]
//	nuk = bytes(range(0x00, 0x20)); cuk = bytes(range(0x20, 0x40))
//	salt = uuid.UUID("8A5DD5C2-3C5F-4E0E-9C3B-1B2D3E4F5A6B").bytes_le
//	for mode, L in (("crypt", 64), ("authenticated", 96)):
//	    for c in (b"", cuk):
//	        print(hkdf(nuk + c, salt, b"plinth data volume v1 " + mode.encode(), L).hex())
var keyVectors = []struct {
	mode    Mode
	withCUK bool
	want    string
}{
	{ModeCrypt, false, "5d4a8455c6b361fed871f45f50d51eeb4805a9e9f0b744b94d720f29f6e48da2af1e2c4cf97c86face11481a057809ea5febf85a39239cd38a5a69f0d8fda880"},
	{ModeCrypt, true, "1be5314c13b8cfe6c668ac0916ebaae0b0cd360ecbbffba8d4eefe48019b85947c33f35f80973fb4380d7b3a4c4f840f2ef374c1dae29d256e3098cd444d2aae"},
	{ModeAuthenticated, false, "d37d9b8a2607c25411f040673d48df7a09e7895f0660046d770da297a05d950ebc0647228e271687e973d134d636791d5f39c06e3839726a6438b87ccf1c31ff80c3827044eecd9eb408f0a0bb5e8cc194ee86c4d5dc8d60378d37df1ad7639b"},
	{ModeAuthenticated, true, "d3ecac762fb0fb83f2fbb2bdc50a1fbd8fdc60ce7153d14ac9cc026f58e996c9a6a52242d7f52ef2940e87c99bcc722bd2eededf313deefd5ac04785eaf15eb6b797b3fe4d6d51e16e12e561742f05955bccfffeda462a353ce42a0856d8e9df"},
}

func seq(from, n int) []byte {
	b := make([]byte, n)
	for i := range b {
		b[i] = byte(from + i)
	}
	return b
}

func TestDeriveVolumeKeyVectors(t *testing.T) {
	nuk, cuk := seq(0, 32), seq(0x20, 32)
	id := gpt.MustParseGUID("8A5DD5C2-3C5F-4E0E-9C3B-1B2D3E4F5A6B")
	for _, v := range keyVectors {
		var c []byte
		if v.withCUK {
			c = cuk
		}
		got, err := DeriveVolumeKey(nuk, c, id, v.mode)
		if err != nil {
			t.Fatal(err)
		}
		if hex.EncodeToString(got) != v.want {
			t.Errorf("%v cuk=%v:\n got %x\nwant %s", v.mode, v.withCUK, got, v.want)
		}
	}
}

func TestDeriveVolumeKeyInputsMatter(t *testing.T) {
	nuk, cuk := seq(0, 32), seq(0x20, 32)
	id := gpt.MustParseGUID("8A5DD5C2-3C5F-4E0E-9C3B-1B2D3E4F5A6B")
	base, err := DeriveVolumeKey(nuk, nil, id, ModeCrypt)
	if err != nil {
		t.Fatal(err)
	}
	if len(base) != CryptKeySize {
		t.Fatalf("crypt key of %d bytes", len(base))
	}
	// An empty CUK is the same as none.
	if k, _ := DeriveVolumeKey(nuk, []byte{}, id, ModeCrypt); !bytes.Equal(k, base) {
		t.Error("empty CUK differs from nil CUK")
	}
	other := map[string]func() ([]byte, error){
		"with CUK":        func() ([]byte, error) { return DeriveVolumeKey(nuk, cuk, id, ModeCrypt) },
		"other CUK":       func() ([]byte, error) { return DeriveVolumeKey(nuk, seq(0x21, 32), id, ModeCrypt) },
		"other NUK":       func() ([]byte, error) { return DeriveVolumeKey(seq(1, 32), nil, id, ModeCrypt) },
		"other partition": func() ([]byte, error) { return DeriveVolumeKey(nuk, nil, gpt.RandomGUID(), ModeCrypt) },
		"other mode":      func() ([]byte, error) { return DeriveVolumeKey(nuk, nil, id, ModeAuthenticated) },
	}
	withCUK, _ := other["with CUK"]()
	for name, f := range other {
		k, err := f()
		if err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		if bytes.Equal(k[:32], base[:32]) {
			t.Errorf("%s: same key as the base case", name)
		}
		if name == "other CUK" && bytes.Equal(k, withCUK) {
			t.Error("changing the CUK did not change the key")
		}
	}
	// The input slices are not modified.
	if !bytes.Equal(nuk, seq(0, 32)) || !bytes.Equal(cuk, seq(0x20, 32)) {
		t.Error("inputs modified")
	}
}

func TestDeriveVolumeKeyRejects(t *testing.T) {
	id := gpt.RandomGUID()
	cases := map[string]func() ([]byte, error){
		"nil NUK":    func() ([]byte, error) { return DeriveVolumeKey(nil, nil, id, ModeCrypt) },
		"short NUK":  func() ([]byte, error) { return DeriveVolumeKey(seq(0, 31), nil, id, ModeCrypt) },
		"long NUK":   func() ([]byte, error) { return DeriveVolumeKey(seq(0, 33), nil, id, ModeCrypt) },
		"short CUK":  func() ([]byte, error) { return DeriveVolumeKey(seq(0, 32), seq(0, 16), id, ModeCrypt) },
		"zero ID":    func() ([]byte, error) { return DeriveVolumeKey(seq(0, 32), nil, gpt.GUID{}, ModeCrypt) },
		"bad mode":   func() ([]byte, error) { return DeriveVolumeKey(seq(0, 32), nil, id, Mode(0)) },
		"mode three": func() ([]byte, error) { return DeriveVolumeKey(seq(0, 32), nil, id, Mode(3)) },
	}
	for name, f := range cases {
		if k, err := f(); err == nil || k != nil {
			t.Errorf("%s: accepted (%x)", name, k)
		} else if !strings.HasPrefix(err.Error(), "storage: ") {
			t.Errorf("%s: error %q lacks the package prefix", name, err)
		}
	}
}
