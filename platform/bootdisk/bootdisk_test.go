package bootdisk

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"unicode/utf16"

	"plinth.dev/plinth/platform/gpt"
	"plinth.dev/plinth/platform/layout"
)

func flashed(esp gpt.GUID, slots ...string) *gpt.Table {
	ps := []gpt.Partition{{Type: espType, ID: esp, FirstLBA: 2048, LastLBA: 4095, Number: 1}}
	for i, s := range slots {
		ps = append(ps, gpt.Partition{Type: slotType, ID: gpt.RandomGUID(), Name: layout.SystemSlotNamePrefix + s,
			FirstLBA: uint64(4096 + 2048*i), LastLBA: uint64(6143 + 2048*i), Number: 2 + i})
	}
	return gpt.NewTable(gpt.RandomGUID(), ps...)
}

func TestChoose(t *testing.T) {
	espA, espB := gpt.RandomGUID(), gpt.RandomGUID()
	diskA := Disk{Path: "/dev/vda", Table: flashed(espA, "a", "b")}
	diskB := Disk{Path: "/dev/sda", Table: flashed(espB, "a", "b")}
	plain := Disk{Path: "/dev/vdb", Table: gpt.NewTable(gpt.RandomGUID(), gpt.Partition{Type: gpt.RandomGUID(), ID: gpt.RandomGUID(), FirstLBA: 2048, LastLBA: 4095, Number: 1})}
	noTable := Disk{Path: "/dev/vdc"}
	for _, c := range []struct {
		name  string
		disks []Disk
		esp   string
		want  string
		err   error
	}{
		{"named by the firmware", []Disk{diskA, diskB, plain}, strings.ToLower(espB.String()), "/dev/sda", nil},
		{"the only flashed disk", []Disk{plain, noTable, diskA}, "", "/dev/vda", nil},
		{"two flashed, not named", []Disk{diskA, diskB}, "", "", nil},
		{"named ESP missing", []Disk{diskA, plain}, espB.String(), "", ErrNotFound},
		{"no flashed disk", []Disk{plain, noTable}, "", "", ErrNotFound},
	} {
		b, err := Choose(c.disks, c.esp, "a")
		switch {
		case c.want != "":
			if err != nil || b.Disk != c.want {
				t.Errorf("%s: %+v, %v", c.name, b, err)
				continue
			}
			dev, p, err := b.Slot("b")
			if err != nil || p.Name != layout.SystemSlotNamePrefix+"b" || dev != c.want+"3" {
				t.Errorf("%s: slot b %s %+v %v", c.name, dev, p, err)
			}
		case err == nil:
			t.Errorf("%s: chose %s", c.name, b.Disk)
		case c.err != nil && !errors.Is(err, c.err):
			t.Errorf("%s: %v, want %v", c.name, err, c.err)
		case c.err == nil && errors.Is(err, ErrNotFound):
			t.Errorf("%s: %v is not an ambiguity", c.name, err)
		}
	}
}

func TestLoaderDevicePartUUID(t *testing.T) {
	dir := t.TempDir()
	if v, err := LoaderDevicePartUUID(dir); v != "" || err != nil {
		t.Fatalf("absent variable: %q, %v", v, err)
	}
	const id = "C8D3F6E4-1234-4ABC-9DEF-0123456789AB"
	b := []byte{6, 0, 0, 0} // attributes: boot service and runtime access
	for _, u := range utf16.Encode([]rune(id + "\x00")) {
		b = append(b, byte(u), byte(u>>8))
	}
	if err := os.WriteFile(filepath.Join(dir, "LoaderDevicePartUUID-"+loaderGUID), b, 0o644); err != nil {
		t.Fatal(err)
	}
	if v, err := LoaderDevicePartUUID(dir); v != id || err != nil {
		t.Fatalf("got %q, %v", v, err)
	}
	if _, err := decodeVarString([]byte{1, 2, 3}); err == nil {
		t.Error("short variable decoded")
	}
}
