package update

import (
	"fmt"
	"strings"

	"plinth.dev/plinth/platform/cmdline"
	"plinth.dev/plinth/platform/eventlog"
	"plinth.dev/plinth/platform/measure"
	"plinth.dev/plinth/platform/uki"
	"plinth.dev/plinth/platform/verity"
)

// UKI is what a boot of a UKI measures and runs, read from its bytes.
type UKI struct {
	// PCR11 is what systemd-stub measures (its sections).
	PCR11 []byte
	// Apps are the Authenticode digests firmware measures into PCR 4: the
	// UKI, then its kernel (the stub starts it through the firmware).
	Apps [][]byte
	// Verity is the system image the command line names; Slot its slot.
	Verity verity.Params
	Slot   string
}

// ReadUKI reads what a boot of img measures and which system image it
// runs.
func ReadUKI(img []byte) (*UKI, error) {
	pcr11, err := uki.PredictPCR11(img)
	if err != nil {
		return nil, err
	}
	a, err := uki.AuthenticodeSHA256(img)
	if err != nil {
		return nil, err
	}
	u := &UKI{PCR11: pcr11, Apps: [][]byte{a}}
	secs, err := uki.Read(img)
	if err != nil {
		return nil, err
	}
	var line string
	for _, s := range secs {
		switch s.Name {
		case uki.Linux:
			k, err := uki.AuthenticodeSHA256(s.Data)
			if err != nil {
				return nil, fmt.Errorf("the UKI's kernel: %w", err)
			}
			u.Apps = append(u.Apps, k)
		case uki.Cmdline:
			line = strings.TrimRight(string(s.Data), "\x00\n ")
		}
	}
	if len(u.Apps) != 2 {
		return nil, fmt.Errorf("the UKI has no kernel section")
	}
	args := cmdline.Parse(line)
	raw, ok := args["plinth.verity"]
	if !ok {
		return nil, fmt.Errorf("the UKI's command line names no system image (plinth.verity=)")
	}
	if u.Verity, err = verity.ParseParams(raw); err != nil {
		return nil, err
	}
	u.Slot = args["plinth.slot"]
	return u, nil
}

// Predict returns the values the PCRs in pcrs will have when the next boot
// runs u instead of this boot's UKI, started by the firmware's first boot
// attempt (BootNext): PCR 4 replays this boot's event log as such a boot
// (eventlog.FirstBootAttempt) with u's digests, 11 is u's, 15 is /init's measurement of the same
// parameters and u's system image; any other PCR (7: Secure Boot state;
// 12: no load options; firmware PCRs) keeps the value it has in current,
// this boot's values at the time it unsealed.
func Predict(u *UKI, events []eventlog.Event, parametersDigest [32]byte, current map[int][]byte, pcrs []int) (map[int][]byte, error) {
	out := make(map[int][]byte, len(pcrs))
	for _, p := range pcrs {
		switch p {
		case 4:
			if events == nil {
				return nil, fmt.Errorf("PCR 4 cannot be predicted without the firmware's event log")
			}
			// The new slot boots through BootNext: the firmware's first
			// boot attempt, whatever this boot's was.
			v, err := eventlog.PredictPCR4(eventlog.FirstBootAttempt(events), u.Apps)
			if err != nil {
				return nil, err
			}
			out[p] = v
		case 11:
			out[p] = u.PCR11
		case measure.PCR:
			out[p] = measure.ExpectedPCR15(parametersDigest, u.Verity.RootHash)
		default:
			v, ok := current[p]
			if !ok {
				return nil, fmt.Errorf("no value of PCR %d from this boot", p)
			}
			out[p] = v
		}
	}
	return out, nil
}
