package efivar

import (
	"bytes"
	"errors"
	"os"
	"path/filepath"
	"slices"
	"testing"
)

// ascii16 is s in UTF-16LE with its terminator, written out by hand.
func ascii16(s string) []byte {
	var b []byte
	for _, c := range []byte(s) {
		b = append(b, c, 0)
	}
	return append(b, 0, 0)
}

var testGUID = [16]byte{0x11, 0x22, 0x33, 0x44, 0x55, 0x66, 0x77, 0x88, 0x99, 0xaa, 0xbb, 0xcc, 0xdd, 0xee, 0xff, 0x00}

// TestLoadOptionGolden: the bytes of a boot entry for \EFI\plinth\b.efi
// on partition 1, as UEFI 2.10 §3.1.3 and §10.3.5 lay them out.
func TestLoadOptionGolden(t *testing.T) {
	o := LoadOption{Attributes: LoadOptionActive, Description: "Plinth b",
		FilePath: BootPath(HardDrive{Number: 1, StartLBA: 2048, Sizes: 262144, GUID: testGUID}, "/EFI/plinth/b.efi")}
	var want []byte
	want = append(want, 0x01, 0, 0, 0) // LOAD_OPTION_ACTIVE
	want = append(want, 86, 0)         // FilePathListLength: 42 + 40 + 4
	want = append(want, ascii16("Plinth b")...)
	want = append(want, 0x04, 0x01, 42, 0) // media, hard drive, length 42
	want = append(want, 1, 0, 0, 0)        // partition 1
	want = append(want, 0x00, 0x08, 0, 0, 0, 0, 0, 0)
	want = append(want, 0x00, 0x00, 0x04, 0, 0, 0, 0, 0)
	want = append(want, testGUID[:]...)
	want = append(want, 0x02, 0x02)        // GPT, GUID signature
	want = append(want, 0x04, 0x04, 40, 0) // media, file path, 4 + 2·18
	want = append(want, ascii16(`\EFI\plinth\b.efi`)...)
	want = append(want, 0x7f, 0xff, 0x04, 0x00)
	got := o.Marshal()
	if !bytes.Equal(got, want) {
		t.Fatalf("load option\n got % x\nwant % x", got, want)
	}
	back, err := ParseLoadOption(got)
	if err != nil || back.Attributes != o.Attributes || back.Description != o.Description || !bytes.Equal(back.FilePath, o.FilePath) || back.OptionalData != nil {
		t.Fatalf("parsed back: %+v, %v", back, err)
	}
	hd, file, ok := ParseBootPath(back.FilePath)
	if !ok || file != `\EFI\plinth\b.efi` || hd != (HardDrive{Number: 1, StartLBA: 2048, Sizes: 262144, GUID: testGUID}) {
		t.Fatalf("ParseBootPath: %+v %q %v", hd, file, ok)
	}
	// Optional data after the path (a command line for systemd-stub).
	o.OptionalData = ascii16("quiet")
	back, err = ParseLoadOption(o.Marshal())
	if err != nil || !bytes.Equal(back.OptionalData, o.OptionalData) {
		t.Fatalf("optional data: %+v, %v", back, err)
	}
}

// TestParseBootPathFirmwareEntry: the path OVMF writes for a disk's
// entry starts with PciRoot/Pci/Sata nodes; the HD and file nodes are
// found behind them. Malformed paths are refused, not misread.
func TestParseBootPathFirmwareEntry(t *testing.T) {
	own := BootPath(HardDrive{Number: 1, StartLBA: 2048, Sizes: 1000, GUID: testGUID}, `\EFI\BOOT\BOOTX64.EFI`)
	prefix := []byte{
		0x02, 0x01, 12, 0, 0xd0, 0x41, 0x03, 0x0a, 0, 0, 0, 0, // ACPI PciRoot(0)
		0x01, 0x01, 6, 0, 2, 0x1f, // PCI(0x1f, 2)
		0x03, 0x12, 10, 0, 0, 0, 0xff, 0xff, 0, 0, // SATA(0, 0xffff, 0)
	}
	hd, file, ok := ParseBootPath(append(prefix, own...))
	if !ok || file != `\EFI\BOOT\BOOTX64.EFI` || hd.Number != 1 || hd.GUID != testGUID {
		t.Fatalf("firmware entry: %+v %q %v", hd, file, ok)
	}
	for name, p := range map[string][]byte{
		"empty":             nil,
		"no end":            own[:len(own)-4],
		"node length 2":     {0x04, 0x01, 2, 0},
		"node past the end": {0x04, 0x04, 200, 0, 'a', 0},
		"file only":         own[42:],
	} {
		if _, _, ok := ParseBootPath(p); ok {
			t.Errorf("%s: accepted", name)
		}
	}
	for name, b := range map[string][]byte{
		"short":                 {1, 0, 0},
		"unterminated":          {1, 0, 0, 0, 0, 0, 'P', 0},
		"path longer than data": append([]byte{1, 0, 0, 0, 200, 0}, ascii16("x")...),
	} {
		if _, err := ParseLoadOption(b); err == nil {
			t.Errorf("load option %s: no error", name)
		}
	}
}

// TestStore: variables in an efivarfs-like directory: attributes in the
// first four bytes, boot entries, BootOrder, BootNext set and cleared.
func TestStore(t *testing.T) {
	s := Store{Dir: t.TempDir()}
	if _, err := s.BootOrder(); !errors.Is(err, ErrNotFound) {
		t.Fatalf("BootOrder of an empty store: %v", err)
	}
	// What firmware left: an entry, an order, a variable of another vendor.
	fw := LoadOption{Attributes: LoadOptionActive, Description: "UEFI QEMU HARDDISK",
		FilePath: BootPath(HardDrive{Number: 1, StartLBA: 2048, Sizes: 10, GUID: testGUID}, `\EFI\BOOT\BOOTX64.EFI`)}
	if err := s.SetBootEntry(1, fw); err != nil {
		t.Fatal(err)
	}
	if err := s.SetBootOrder([]uint16{1, 0}); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(s.Dir, "Boot0002-4a67b082-0a4c-41cf-b6c7-440b29bb8c4f"), []byte{7, 0, 0, 0, 1}, 0o644); err != nil {
		t.Fatal(err)
	}
	raw, err := os.ReadFile(filepath.Join(s.Dir, "BootOrder-"+GlobalGUID))
	if err != nil || !bytes.Equal(raw, []byte{7, 0, 0, 0, 1, 0, 0, 0}) {
		t.Fatalf("BootOrder file: % x, %v", raw, err)
	}
	entries, err := s.BootEntries()
	if err != nil || len(entries) != 1 || entries[1].Description != fw.Description {
		t.Fatalf("entries %+v, %v; want firmware's Boot0001 only", entries, err)
	}
	n, err := FreeBootNumber(entries)
	if err != nil || n != 0 {
		t.Fatalf("free number %d, %v", n, err)
	}
	if err := s.SetBootEntry(n, LoadOption{Attributes: LoadOptionActive, Description: "Plinth b", FilePath: BootPath(HardDrive{Number: 3}, `\EFI\plinth\b.efi`)}); err != nil {
		t.Fatal(err)
	}
	entries, _ = s.BootEntries()
	if !slices.Equal(SortedNumbers(entries), []uint16{0, 1}) {
		t.Fatalf("entries after adding: %v", SortedNumbers(entries))
	}
	if err := s.SetBootNext(0); err != nil {
		t.Fatal(err)
	}
	if next, err := s.BootNext(); err != nil || next != 0 {
		t.Fatalf("BootNext %d, %v", next, err)
	}
	if err := s.ClearBootNext(); err != nil {
		t.Fatal(err)
	}
	if _, err := s.BootNext(); !errors.Is(err, ErrNotFound) {
		t.Fatalf("BootNext after clearing: %v", err)
	}
	if err := s.ClearBootNext(); err != nil {
		t.Fatalf("clearing a missing BootNext: %v", err)
	}
	order, err := s.BootOrder()
	if err != nil || !slices.Equal(order, []uint16{1, 0}) {
		t.Fatalf("BootOrder %v, %v", order, err)
	}
	// A corrupt value is an error, not a guess.
	os.WriteFile(filepath.Join(s.Dir, "BootCurrent-"+GlobalGUID), []byte{6, 0, 0, 0, 1}, 0o644)
	if _, err := s.BootCurrent(); err == nil {
		t.Error("BootCurrent of 1 byte: no error")
	}
	os.WriteFile(filepath.Join(s.Dir, "Boot0005-"+GlobalGUID), []byte{1, 0}, 0o644)
	if _, err := s.BootEntries(); err == nil {
		t.Error("a Boot#### variable without attributes: no error")
	}
}
