package image

import (
	"context"
	"encoding/base64"
	"encoding/hex"
	"fmt"
	"os"
	"path/filepath"
	"strings"

	"plinth.dev/plinth/platform/layout"
	"plinth.dev/plinth/platform/uki"
)

// The Unified Kernel Images, one EFI executable each on systemd's EFI
// stub (platform/uki), with their command line measured by the stub:
//
//	plinth.efi     network boot (UEFI PXE/HTTP): the whole initramfs,
//	               system image included, command line without a slot
//	plinth-a.efi   disk boot of slot a: /init and early modules only,
//	plinth-b.efi   the system image is the slot's partition (plinth.slot=)
//
// The manifest records, for each, the PCR 11 value the stub will produce
// and the Authenticode digest firmware extends into PCR 4, so a node can
// predict the PCRs of an image before it boots it.

// UKI artefact names in OutDir.
const (
	UKIFile  = "plinth.efi"
	DiskFile = "disk.img"
)

// UKISlotFile is the artefact name of slot s's UKI.
func UKISlotFile(slot string) string { return "plinth-" + slot + ".efi" }

// Slots are the disk's system slots.
var Slots = []string{"a", "b"}

// DefaultStub is Debian's systemd EFI stub (package systemd-boot-efi).
const DefaultStub = "/usr/lib/systemd/boot/efi/linuxx64.efi.stub"

// UKIInfo describes one UKI in the manifest.
type UKIInfo struct {
	// Slot is the system slot the UKI boots, "" for the network-boot UKI.
	Slot    string `json:"slot,omitempty"`
	Cmdline string `json:"cmdline"`
	// PCR11 is the SHA-256 PCR 11 value systemd-stub produces when it
	// boots this UKI (its measured sections), hex.
	PCR11 string `json:"pcr11"`
	// Authenticode is the UKI's SHA-256 Authenticode digest, hex: what
	// UEFI firmware extends into PCR 4 when it starts it.
	Authenticode string `json:"authenticode"`
}

// osRelease is the UKI's .osrel section.
func osRelease(version string) []byte {
	return []byte(fmt.Sprintf("NAME=Plinth\nID=plinth\nVERSION_ID=%s\nPRETTY_NAME=\"Plinth %s\"\nHOME_URL=https://plinth.dev/\n", version, version))
}

// writeUKI builds a UKI from the stub and writes it to out.
func writeUKI(stub []byte, out string, k *Kernel, version, cmdline string, initrd []byte) (UKIInfo, error) {
	return buildUKI(stub, out, cmdline, []uki.Section{
		{Name: uki.OSRel, Data: osRelease(version)},
		{Name: uki.Cmdline, Data: []byte(cmdline)},
		{Name: uki.Uname, Data: []byte(k.Version)},
		{Name: uki.Linux, Data: k.Image},
		{Name: uki.Initrd, Data: initrd},
	})
}

// buildUKI builds a UKI of the sections on the stub, writes it to out and
// returns its description (cmdline is its .cmdline).
func buildUKI(stub []byte, out, cmdline string, sections []uki.Section) (UKIInfo, error) {
	img, err := uki.Build(stub, sections)
	if err != nil {
		return UKIInfo{}, err
	}
	pcr11, err := uki.PredictPCR11(img)
	if err != nil {
		return UKIInfo{}, err
	}
	auth, err := uki.AuthenticodeSHA256(img)
	if err != nil {
		return UKIInfo{}, err
	}
	if err := writeFileAtomic(out, img); err != nil {
		return UKIInfo{}, err
	}
	return UKIInfo{Cmdline: cmdline, PCR11: hex.EncodeToString(pcr11), Authenticode: hex.EncodeToString(auth)}, nil
}

// writeUKIs is the build's step that writes the network-boot UKI (on the
// whole initramfs) and a UKI per slot (on the initramfs without the system
// image): sets the manifest's UKIs.
func (b *buildState) writeUKIs(context.Context) (string, error) {
	stubPath := b.Stub
	if stubPath == "" {
		stubPath = DefaultStub
	}
	stub, err := os.ReadFile(stubPath)
	if err != nil {
		return "", fmt.Errorf("reading the EFI stub (make deps installs systemd-boot-efi): %w", err)
	}
	m := b.m
	m.UKIs = map[string]UKIInfo{}
	netboot := strings.Join(append([]string{m.Cmdline}, b.NetbootArgs...), " ")
	info, err := writeUKI(stub, b.out(UKIFile), b.kernel, b.version, netboot, b.initramfs)
	if err != nil {
		return "", err
	}
	m.UKIs[UKIFile] = info
	var sizes []string
	for _, s := range Slots {
		cmdline := m.Cmdline + " " + layout.SlotArg + "=" + s
		info, err := writeUKI(stub, b.out(UKISlotFile(s)), b.kernel, b.version, cmdline, b.bootInitramfs)
		if err != nil {
			return "", err
		}
		info.Slot = s
		m.UKIs[UKISlotFile(s)] = info
	}
	for _, n := range append([]string{UKIFile}, UKISlotFile(Slots[0])) {
		st, err := os.Stat(b.out(n))
		if err != nil {
			return "", err
		}
		sizes = append(sizes, fmt.Sprintf("%s %s", n, mib(st.Size())))
	}
	return strings.Join(sizes, ", ") + ", PCR 11 of slot a " + m.UKIs[UKISlotFile("a")].PCR11[:16], nil
}

// NetbootUKI writes to out the image's network-boot UKI (plinth.efi in
// imageDir) with a cluster's register parameters added to its command
// line (plinth.parameters=), as `plinthctl build --params` makes it, and
// returns its description. stub is systemd's EFI stub ("": DefaultStub).
func NetbootUKI(imageDir, stub string, params []byte, out string) (UKIInfo, error) {
	return RebuildUKI(filepath.Join(imageDir, UKIFile), stub, out, func(c string) string {
		return c + " " + parametersArg + "=" + base64.RawURLEncoding.EncodeToString(params)
	})
}

// RebuildUKI writes to out the UKI in rebuilt on stub ("": DefaultStub)
// with its command line changed by edit, every other section the same,
// and returns its description.
func RebuildUKI(in, stub, out string, edit func(cmdline string) string) (UKIInfo, error) {
	if stub == "" {
		stub = DefaultStub
	}
	stubData, err := os.ReadFile(stub)
	if err != nil {
		return UKIInfo{}, fmt.Errorf("reading the EFI stub (make deps installs systemd-boot-efi): %w", err)
	}
	img, err := os.ReadFile(in)
	if err != nil {
		return UKIInfo{}, err
	}
	secs, err := uki.Read(img)
	if err != nil {
		return UKIInfo{}, err
	}
	stubSecs, err := uki.Read(stubData)
	if err != nil {
		return UKIInfo{}, err
	}
	if len(secs) <= len(stubSecs) {
		return UKIInfo{}, fmt.Errorf("%s has no sections beyond the stub's", in)
	}
	var added []uki.Section
	cmdline := ""
	for _, s := range secs[len(stubSecs):] {
		if s.Name == uki.Cmdline {
			cmdline = edit(string(s.Data))
			s.Data = []byte(cmdline)
		}
		added = append(added, s)
	}
	return buildUKI(stubData, out, cmdline, added)
}

// parametersArg is the kernel argument of parameters on the command line
// (roleserver/parameters.CmdlineKey; the builder does not link it).
const parametersArg = "plinth.parameters"
