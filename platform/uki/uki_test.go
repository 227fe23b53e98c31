package uki

import (
	"bytes"
	"crypto/rand"
	"crypto/rsa"
	"crypto/sha256"
	"crypto/x509"
	"crypto/x509/pkix"
	"debug/pe"
	"encoding/binary"
	"encoding/pem"
	"math/big"
	mrand "math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"sort"
	"strings"
	"testing"
	"time"
)

// stubPath is Debian 12's systemd-boot-efi 252 stub.
const stubPath = "/usr/lib/systemd/boot/efi/linuxx64.efi.stub"

func loadStub(t *testing.T) []byte {
	t.Helper()
	b, err := os.ReadFile(stubPath)
	if err != nil {
		t.Fatalf("install systemd-boot-efi (make deps): %v", err)
	}
	return b
}

// pseudoRandom returns n deterministic pseudo-random bytes.
func pseudoRandom(seed byte, n int) []byte {
	var key [32]byte
	key[0] = seed
	b := make([]byte, n)
	mrand.NewChaCha8(key).Read(b)
	return b
}

// testSections are the sections of test 1: small text sections, a
// 3 MiB+123 "kernel" and a 5 MiB+7 "initrd".
func testSections() []Section {
	return []Section{
		{OSRel, []byte("ID=plinth\nVERSION_ID=1\n")},
		{Cmdline, []byte("console=ttyS0 ro quiet")},
		{Uname, []byte("6.1.0-test-amd64")},
		{Linux, pseudoRandom(1, 3<<20+123)},
		{Initrd, pseudoRandom(2, 5<<20+7)},
	}
}

func mustPE(t *testing.T, image []byte) *pe.File {
	t.Helper()
	f, err := pe.NewFile(bytes.NewReader(image))
	if err != nil {
		t.Fatalf("debug/pe: %v", err)
	}
	t.Cleanup(func() { f.Close() })
	return f
}

func opt64(t *testing.T, f *pe.File) *pe.OptionalHeader64 {
	t.Helper()
	o, ok := f.OptionalHeader.(*pe.OptionalHeader64)
	if !ok {
		t.Fatalf("optional header is %T, want PE32+", f.OptionalHeader)
	}
	return o
}

func align(x, a uint32) uint32 { return (x + a - 1) &^ (a - 1) }

// TestBuildLayout: the added sections are where the rules put them, the
// stub is unchanged and debug/pe reads the result back.
func TestBuildLayout(t *testing.T) {
	stub := loadStub(t)
	stubCopy := slices.Clone(stub)
	secs := testSections()
	img, err := Build(stub, secs)
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(stub, stubCopy) {
		t.Fatal("Build modified the stub")
	}
	sf, f := mustPE(t, stub), mustPE(t, img)
	so, o := opt64(t, sf), opt64(t, f)
	nOld := len(sf.Sections)
	if nOld != 8 {
		t.Errorf("stub has %d sections, want 8", nOld)
	}
	if len(f.Sections) != nOld+len(secs) || int(f.FileHeader.NumberOfSections) != nOld+len(secs) {
		t.Fatalf("image has %d sections, want %d", len(f.Sections), nOld+len(secs))
	}
	t.Logf("stub: SectionAlignment %#x FileAlignment %#x SizeOfHeaders %#x SizeOfImage %#x",
		so.SectionAlignment, so.FileAlignment, so.SizeOfHeaders, so.SizeOfImage)
	sa, fa := o.SectionAlignment, o.FileAlignment

	// Where the stub ends, in the file and in memory.
	var rawEnd, memEnd uint32 = so.SizeOfHeaders, so.SizeOfImage
	for _, s := range sf.Sections {
		rawEnd = max(rawEnd, s.Offset+s.Size)
		memEnd = max(memEnd, s.VirtualAddress+s.VirtualSize)
	}

	var initAdded uint32
	for i, want := range secs {
		s := f.Sections[nOld+i]
		if s.Name != want.Name {
			t.Errorf("section %d: name %q, want %q", nOld+i, s.Name, want.Name)
		}
		if s.VirtualAddress%sa != 0 || s.Offset%fa != 0 {
			t.Errorf("%s: VirtualAddress %#x / PointerToRawData %#x not aligned", s.Name, s.VirtualAddress, s.Offset)
		}
		if s.VirtualSize != uint32(len(want.Data)) || s.Size != align(uint32(len(want.Data)), fa) {
			t.Errorf("%s: VirtualSize %#x SizeOfRawData %#x for %#x bytes", s.Name, s.VirtualSize, s.Size, len(want.Data))
		}
		if s.Characteristics != 0x40000040 {
			t.Errorf("%s: Characteristics %#x", s.Name, s.Characteristics)
		}
		raw, err := s.Data()
		if err != nil {
			t.Fatal(err)
		}
		if !bytes.Equal(raw[:len(want.Data)], want.Data) || !allZero(raw[len(want.Data):]) {
			t.Errorf("%s: raw data differs from input or padding not zero", s.Name)
		}
		initAdded += s.Size
	}
	first := f.Sections[nOld]
	if first.Offset != align(rawEnd, fa) || first.VirtualAddress != align(memEnd, sa) {
		t.Errorf("first added section at file %#x VA %#x, want %#x and %#x",
			first.Offset, first.VirtualAddress, align(rawEnd, fa), align(memEnd, sa))
	}

	// No overlaps, in memory or in the file.
	type span struct {
		name       string
		start, end uint32
	}
	check := func(kind string, spans []span) {
		sort.Slice(spans, func(i, j int) bool { return spans[i].start < spans[j].start })
		for i := 1; i < len(spans); i++ {
			if spans[i].start < spans[i-1].end {
				t.Errorf("%s overlap: %s [%#x,%#x) and %s [%#x,%#x)", kind,
					spans[i-1].name, spans[i-1].start, spans[i-1].end, spans[i].name, spans[i].start, spans[i].end)
			}
		}
	}
	var mem, file []span
	last := f.Sections[len(f.Sections)-1]
	for _, s := range f.Sections {
		mem = append(mem, span{s.Name, s.VirtualAddress, s.VirtualAddress + s.VirtualSize})
		file = append(file, span{s.Name, s.Offset, s.Offset + s.Size})
	}
	check("virtual", mem)
	check("file", file)

	if want := align(last.VirtualAddress+last.VirtualSize, sa); o.SizeOfImage != want {
		t.Errorf("SizeOfImage %#x, want %#x", o.SizeOfImage, want)
	}
	if o.SizeOfInitializedData != so.SizeOfInitializedData+initAdded {
		t.Errorf("SizeOfInitializedData %#x, want %#x", o.SizeOfInitializedData, so.SizeOfInitializedData+initAdded)
	}
	if uint32(len(img)) != last.Offset+last.Size {
		t.Errorf("file length %#x, want end of last section %#x", len(img), last.Offset+last.Size)
	}

	// The stub's sections: same headers, same bytes at the same offsets.
	for i, s := range sf.Sections {
		if f.Sections[i].SectionHeader != s.SectionHeader {
			t.Errorf("stub section %s header changed: %+v", s.Name, f.Sections[i].SectionHeader)
		}
		if !bytes.Equal(img[s.Offset:s.Offset+s.Size], stub[s.Offset:s.Offset+s.Size]) {
			t.Errorf("stub section %s bytes changed", s.Name)
		}
	}

	// The headers: identical except for the fields Build documents.
	h, err := parseHeaders(stub)
	if err != nil {
		t.Fatal(err)
	}
	changed := map[int]bool{}
	mark := func(off, n int) {
		for i := off; i < off+n; i++ {
			changed[i] = true
		}
	}
	mark(h.coffOff+2, 2)  // NumberOfSections
	mark(h.coffOff+8, 8)  // PointerToSymbolTable, NumberOfSymbols
	mark(h.coffOff+18, 2) // Characteristics
	mark(h.optOff+8, 4)   // SizeOfInitializedData
	mark(h.optOff+56, 4)  // SizeOfImage
	mark(h.optOff+64, 4)  // CheckSum
	mark(h.sectTableOff+nOld*40, len(secs)*40)
	for i := 0; i < int(so.SizeOfHeaders); i++ {
		if img[i] != stub[i] && !changed[i] {
			t.Errorf("header byte %#x changed: %#x -> %#x", i, stub[i], img[i])
		}
	}
	if sf.FileHeader.PointerToSymbolTable != 0 {
		t.Logf("stub has a COFF symbol table at %#x (%d symbols, file size %#x); Build drops it",
			sf.FileHeader.PointerToSymbolTable, sf.FileHeader.NumberOfSymbols, len(stub))
	}
	if f.FileHeader.PointerToSymbolTable != 0 || f.FileHeader.NumberOfSymbols != 0 {
		t.Errorf("image still points to a symbol table")
	}
	if f.FileHeader.Characteristics&^0x0008 != sf.FileHeader.Characteristics&^0x0008 {
		t.Errorf("file Characteristics %#x, stub %#x", f.FileHeader.Characteristics, sf.FileHeader.Characteristics)
	}
}

// refChecksum is a word-by-word transcription of CheckSumMappedFile, for
// cross-checking only.
func refChecksum(b []byte, csOff int) uint32 {
	var sum uint32
	for i := 0; i < len(b); i += 2 {
		var w uint32
		for j := 0; j < 2 && i+j < len(b); j++ {
			if i+j < csOff || i+j >= csOff+4 {
				w |= uint32(b[i+j]) << (8 * j)
			}
		}
		sum += w
		sum = sum&0xffff + sum>>16
	}
	return sum + uint32(len(b))
}

// TestChecksum: Checksum agrees with the stub's own CheckSum (written by
// the toolchain), with what Build stores, and reacts to changes.
func TestChecksum(t *testing.T) {
	stub := loadStub(t)
	so := opt64(t, mustPE(t, stub))
	if so.CheckSum != 0 {
		t.Logf("stub CheckSum field %#08x, Checksum(stub) %#08x", so.CheckSum, Checksum(stub))
		if got := Checksum(stub); got != so.CheckSum {
			t.Errorf("Checksum(stub) = %#x, stub's field says %#x", got, so.CheckSum)
		}
	} else {
		t.Log("stub CheckSum field is zero; relying on the other checks")
	}

	img, err := Build(stub, testSections())
	if err != nil {
		t.Fatal(err)
	}
	o := opt64(t, mustPE(t, img))
	sum := Checksum(img)
	if o.CheckSum != sum {
		t.Errorf("CheckSum field %#x, Checksum(image) %#x", o.CheckSum, sum)
	}
	cs := checksumOffset(img)
	if ref := refChecksum(img, cs); ref != sum {
		t.Errorf("reference checksum %#x, Checksum %#x", ref, sum)
	}

	// One byte in .linux changes the sum; the CheckSum field itself does not.
	f := mustPE(t, img)
	at := int(f.Sections[len(f.Sections)-2].Offset) + 1000
	img[at] ^= 0x5a
	if Checksum(img) == sum {
		t.Error("flipping a byte in .linux did not change Checksum")
	}
	img[at] ^= 0x5a
	binary.LittleEndian.PutUint32(img[cs:], 0xdeadbeef)
	if Checksum(img) != sum {
		t.Error("Checksum depends on the CheckSum field")
	}

	// Odd length: the last byte is a low half-word.
	odd := append(slices.Clone(img), 0x7f)
	if got, ref := Checksum(odd), refChecksum(odd, cs); got != ref || got == sum {
		t.Errorf("odd length: Checksum %#x, reference %#x, even %#x", got, ref, sum)
	}
}

// TestReadAndPCR11: Read returns every section as in memory; PredictPCR11
// follows MeasuredOrder, not the order of the sections, and skips .uname.
func TestReadAndPCR11(t *testing.T) {
	stub := loadStub(t)
	secs := testSections()
	img, err := Build(stub, secs)
	if err != nil {
		t.Fatal(err)
	}
	got, err := Read(img)
	if err != nil {
		t.Fatal(err)
	}
	stubSecs, err := Read(stub)
	if err != nil {
		t.Fatal(err)
	}
	if len(got) != len(stubSecs)+len(secs) {
		t.Fatalf("Read: %d sections, want %d", len(got), len(stubSecs)+len(secs))
	}
	for i, s := range append(stubSecs, secs...) {
		if got[i].Name != s.Name || !bytes.Equal(got[i].Data, s.Data) {
			t.Errorf("Read section %d: %q (%d bytes), want %q (%d bytes)", i, got[i].Name, len(got[i].Data), s.Name, len(s.Data))
		}
	}
	if stubSecs[0].Name != ".text" || len(stubSecs[0].Data) != 0xbff0 {
		t.Errorf("stub .text: %q, %#x bytes", stubSecs[0].Name, len(stubSecs[0].Data))
	}

	// VirtualSize beyond SizeOfRawData reads as zeros.
	small, err := Build(stub, []Section{{OSRel, []byte("ID=x\n")}})
	if err != nil {
		t.Fatal(err)
	}
	h, _ := parseHeaders(small)
	vsOff := h.sectTableOff + (len(h.sections)-1)*40 + 8
	binary.LittleEndian.PutUint32(small[vsOff:], 0x300)
	binary.LittleEndian.PutUint32(small[h.optOff+56:], h.sizeOfImage+0x200)
	rs, err := Read(small)
	if err != nil {
		t.Fatal(err)
	}
	if d := rs[len(rs)-1].Data; len(d) != 0x300 || string(d[:5]) != "ID=x\n" || !allZero(d[5:]) {
		t.Errorf("VirtualSize 0x300 section read as %d bytes %q...", len(d), d[:min(len(d), 8)])
	}

	// A tiny UKI, sections added out of measuring order.
	linux, initrd := []byte("MZ fake kernel"), []byte("070701 fake initrd")
	osrel, cmdline := []byte("ID=plinth\n"), []byte("quiet")
	tiny := []Section{
		{Initrd, initrd}, {Uname, []byte("6.1.0")}, {Linux, linux},
		{Cmdline, cmdline}, {PCRSig, []byte(`{"sha256":[]}`)}, {OSRel, osrel},
	}
	pcr := make([]byte, 32)
	extend := func(b []byte) {
		d := sha256.Sum256(b)
		n := sha256.Sum256(append(slices.Clone(pcr), d[:]...))
		pcr = n[:]
	}
	for _, s := range []struct {
		name string
		data []byte
	}{{".linux", linux}, {".osrel", osrel}, {".cmdline", cmdline}, {".initrd", initrd}} {
		extend([]byte(s.name + "\x00"))
		extend(s.data)
	}
	img1, err := Build(stub, tiny)
	if err != nil {
		t.Fatal(err)
	}
	got1, err := PredictPCR11(img1)
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(got1, pcr) {
		t.Errorf("PredictPCR11 = %x, want %x", got1, pcr)
	}
	// Other order, without .uname and .pcrsig: same value.
	img2, err := Build(stub, []Section{{OSRel, osrel}, {Linux, linux}, {Cmdline, cmdline}, {Initrd, initrd}})
	if err != nil {
		t.Fatal(err)
	}
	if got2, err := PredictPCR11(img2); err != nil || !bytes.Equal(got2, pcr) {
		t.Errorf("PredictPCR11 (other order, no .uname/.pcrsig) = %x, %v; want %x", got2, err, pcr)
	}
	// A different .cmdline: different value. The bare stub: nothing measured.
	img3, err := Build(stub, []Section{{Linux, linux}, {Cmdline, []byte("quiet ")}})
	if err != nil {
		t.Fatal(err)
	}
	if got3, _ := PredictPCR11(img3); bytes.Equal(got3, pcr) {
		t.Error("PredictPCR11 ignores .cmdline")
	}
	if got0, err := PredictPCR11(stub); err != nil || !allZero(got0) || len(got0) != 32 {
		t.Errorf("PredictPCR11(stub) = %x, %v; want 32 zero bytes", got0, err)
	}
}

// writeKeyPair writes a throw-away self-signed code-signing certificate and
// its key as PEM files.
func writeKeyPair(t *testing.T, dir string) (keyPath, certPath string) {
	t.Helper()
	key, err := rsa.GenerateKey(rand.Reader, 2048)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{
		SerialNumber:          big.NewInt(1),
		Subject:               pkix.Name{CommonName: "plinth uki test"},
		NotBefore:             time.Now().Add(-time.Hour),
		NotAfter:              time.Now().Add(time.Hour),
		KeyUsage:              x509.KeyUsageDigitalSignature | x509.KeyUsageCertSign,
		ExtKeyUsage:           []x509.ExtKeyUsage{x509.ExtKeyUsageCodeSigning},
		BasicConstraintsValid: true,
		IsCA:                  true,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		t.Fatal(err)
	}
	keyDER, err := x509.MarshalPKCS8PrivateKey(key)
	if err != nil {
		t.Fatal(err)
	}
	keyPath, certPath = filepath.Join(dir, "key.pem"), filepath.Join(dir, "cert.pem")
	if err := os.WriteFile(keyPath, pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: keyDER}), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(certPath, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}), 0o644); err != nil {
		t.Fatal(err)
	}
	return keyPath, certPath
}

// sign signs image with sbsign, checks it with sbverify and returns the
// signed file and the digest sbsign put into the signature.
func sign(t *testing.T, dir, name string, image []byte, key, cert string) (signed, digest []byte) {
	t.Helper()
	in, out := filepath.Join(dir, name+".efi"), filepath.Join(dir, name+".signed.efi")
	if err := os.WriteFile(in, image, 0o644); err != nil {
		t.Fatal(err)
	}
	if b, err := exec.Command("sbsign", "--key", key, "--cert", cert, "--output", out, in).CombinedOutput(); err != nil {
		t.Fatalf("sbsign: %v\n%s", err, b)
	}
	if b, err := exec.Command("sbverify", "--cert", cert, out).CombinedOutput(); err != nil {
		t.Fatalf("sbverify: %v\n%s", err, b)
	}
	signed, err := os.ReadFile(out)
	if err != nil {
		t.Fatal(err)
	}
	if got, field := Checksum(signed), opt64(t, mustPE(t, signed)).CheckSum; got != field {
		t.Errorf("%s: sbsign wrote CheckSum %#x, Checksum says %#x", name, field, got)
	}
	dd := opt64(t, mustPE(t, signed)).DataDirectory[4]
	if dd.Size == 0 || int(dd.VirtualAddress)+int(dd.Size) != len(signed) {
		t.Fatalf("%s: certificate table %+v, file %#x bytes", name, dd, len(signed))
	}
	table := signed[dd.VirtualAddress:]
	// DigestInfo of SpcIndirectDataContent: sha256 OID, NULL, OCTET STRING(32).
	marker := []byte{0x06, 0x09, 0x60, 0x86, 0x48, 0x01, 0x65, 0x03, 0x04, 0x02, 0x01, 0x05, 0x00, 0x04, 0x20}
	i := bytes.Index(table, marker)
	if i < 0 || i+len(marker)+32 > len(table) {
		t.Fatalf("%s: no SHA-256 DigestInfo in the certificate table", name)
	}
	return signed, table[i+len(marker) : i+len(marker)+32]
}

// plainDigest is the Authenticode digest of a gap-free image written out
// directly: everything but the CheckSum field and the Certificate Table
// entry, up to the end of the file.
func plainDigest(image []byte) []byte {
	h, err := parseHeaders(image)
	if err != nil {
		panic(err)
	}
	d := sha256.New()
	d.Write(image[:h.checksumOff])
	d.Write(image[h.checksumOff+4 : h.certDirOff])
	d.Write(image[h.certDirOff+8:])
	return d.Sum(nil)
}

// TestAuthenticode: AuthenticodeSHA256 is the digest sbsign signs, for the
// unsigned and the signed image, and hashes data after the last section.
func TestAuthenticode(t *testing.T) {
	for _, tool := range []string{"sbsign", "sbverify"} {
		if _, err := exec.LookPath(tool); err != nil {
			t.Fatal("install sbsigntool (make deps)")
		}
	}
	img, err := Build(loadStub(t), testSections())
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	key, cert := writeKeyPair(t, dir)

	want, err := AuthenticodeSHA256(img)
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("Authenticode SHA-256 of the test UKI: %x", want)
	if !bytes.Equal(want, plainDigest(img)) {
		t.Errorf("AuthenticodeSHA256 %x, straight hash %x", want, plainDigest(img))
	}
	signed, signedDigest := sign(t, dir, "uki", img, key, cert)
	if !bytes.Equal(signedDigest, want) {
		t.Errorf("sbsign signed digest %x, AuthenticodeSHA256 %x", signedDigest, want)
	}
	if got, err := AuthenticodeSHA256(signed); err != nil || !bytes.Equal(got, want) {
		t.Errorf("AuthenticodeSHA256(signed) = %x, %v; want %x", got, err, want)
	}

	// Data after the last section is hashed (24 bytes: sbsign pads to 8).
	tail := append(slices.Clone(img), []byte("trailing data, 24 bytes!")...)
	tailDigest, err := AuthenticodeSHA256(tail)
	if err != nil {
		t.Fatal(err)
	}
	if bytes.Equal(tailDigest, want) || !bytes.Equal(tailDigest, plainDigest(tail)) {
		t.Errorf("tail digest %x: image digest %x, straight hash %x", tailDigest, want, plainDigest(tail))
	}
	signedTail, tailSigned := sign(t, dir, "tail", tail, key, cert)
	if !bytes.Equal(tailSigned, tailDigest) {
		t.Errorf("sbsign signed digest with tail %x, AuthenticodeSHA256 %x", tailSigned, tailDigest)
	}
	if got, err := AuthenticodeSHA256(signedTail); err != nil || !bytes.Equal(got, tailDigest) {
		t.Errorf("AuthenticodeSHA256(signed with tail) = %x, %v; want %x", got, err, tailDigest)
	}
	tail[len(tail)-1] ^= 1
	if d, _ := AuthenticodeSHA256(tail); bytes.Equal(d, tailDigest) {
		t.Error("changing the tail does not change the digest")
	}
}

// TestReproducibleAndErrors: same inputs, same bytes; bad inputs refused.
func TestReproducibleAndErrors(t *testing.T) {
	stub := loadStub(t)
	a, err := Build(stub, testSections())
	if err != nil {
		t.Fatal(err)
	}
	b, err := Build(slices.Clone(stub), testSections())
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(a, b) {
		t.Fatal("two builds from the same inputs differ")
	}

	one := []Section{{Linux, []byte("kernel")}}
	signedStub := slices.Clone(stub)
	h, _ := parseHeaders(stub)
	binary.LittleEndian.PutUint32(signedStub[h.certDirOff:], uint32(len(stub)))
	binary.LittleEndian.PutUint32(signedStub[h.certDirOff+4:], 8)
	pe32 := slices.Clone(stub)
	binary.LittleEndian.PutUint16(pe32[h.optOff:], 0x10b)
	many := make([]Section, 21)
	for i := range many {
		many[i] = Section{Name: ".x" + string(rune('a'+i)), Data: []byte{1}}
	}
	for _, c := range []struct {
		name     string
		stub     []byte
		sections []Section
		want     string
	}{
		{"9-byte name", stub, []Section{{".toolong9", []byte("x")}}, "longer than 8"},
		{"duplicate .sbat", stub, []Section{{".sbat", []byte("x")}}, "duplicate"},
		{"duplicate new", stub, []Section{{Linux, []byte("a")}, {Linux, []byte("b")}}, "duplicate"},
		{"stub prefix", stub, []Section{{".linux2", []byte("x")}}, "prefix"},
		{"empty name", stub, []Section{{"", []byte("x")}}, "empty section name"},
		{"empty data", stub, []Section{{Cmdline, nil}}, "empty"},
		{"no sections", stub, nil, "no sections"},
		{"not PE", []byte("this is not a PE file at all, just some text........................"), one, "not a PE"},
		{"random", pseudoRandom(3, 4096), one, "not a PE"},
		{"PE32", pe32, one, "not PE32+"},
		{"signed stub", signedStub, one, "certificate table"},
		{"no room", stub, many, "no room"},
	} {
		_, err := Build(c.stub, c.sections)
		if err == nil {
			t.Errorf("%s: Build succeeded", c.name)
			continue
		}
		if !strings.Contains(err.Error(), c.want) {
			t.Errorf("%s: error %q does not mention %q", c.name, err, c.want)
		}
		t.Logf("%s: %v", c.name, err)
	}
	for _, fn := range []func([]byte) error{
		func(b []byte) error { _, err := Read(b); return err },
		func(b []byte) error { _, err := PredictPCR11(b); return err },
		func(b []byte) error { _, err := AuthenticodeSHA256(b); return err },
	} {
		if err := fn([]byte("MZ not really")); err == nil {
			t.Error("non-PE input accepted")
		}
	}
}
