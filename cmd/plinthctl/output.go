package main

import (
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	"strings"
	"text/tabwriter"
	"time"

	"google.golang.org/protobuf/encoding/protojson"

	"plinth.dev/plinth/api/clusterpb"
)

// How nodes and log entries are printed (nodes, approve, logs).

func shortState(s clusterpb.NodeState) string {
	return strings.TrimPrefix(s.String(), "NODE_STATE_")
}

func shortHealth(h clusterpb.NodeHealth) string {
	if h == clusterpb.NodeHealth_NODE_HEALTH_UNSPECIFIED {
		return "-"
	}
	return strings.TrimPrefix(h.String(), "NODE_HEALTH_")
}

func shortTPM(u clusterpb.NodeTPMUsage) string {
	return strings.TrimPrefix(u.String(), "NODE_TPM_USAGE_")
}

// roleNames are the roles as the roles command spells them.
func roleNames(r *clusterpb.NodeRoles) []string {
	var out []string
	if r.GetConsensusMember() != nil {
		out = append(out, "consensus-member")
	}
	if r.GetKubernetesController() != nil {
		out = append(out, "kubernetes-controller")
	}
	if r.GetKubernetesWorker() != nil {
		out = append(out, "kubernetes-worker")
	}
	return out
}

func lastSeen(unixNanos int64, now time.Time) string {
	if unixNanos == 0 {
		return "never"
	}
	d := now.Sub(time.Unix(0, unixNanos))
	if d < 0 {
		d = 0
	}
	return d.Round(time.Second).String() + " ago"
}

func orDash(s string) string {
	if s == "" {
		return "-"
	}
	return s
}

func printNodeTable(w io.Writer, nodes []*clusterpb.Node, now time.Time) error {
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "ID\tSTATE\tHEALTH\tADDRESS\tROLES\tETCD\tVERSION\tLAST SEEN")
	for _, n := range nodes {
		var addr string
		if a := n.GetStatus().GetAddresses(); len(a) > 0 {
			addr = a[0]
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\n", n.GetId(), shortState(n.GetState()), shortHealth(n.GetHealth()),
			orDash(addr), orDash(strings.Join(roleNames(n.GetRoles()), ",")), membership(n), versionText(n.GetStatus()),
			lastSeen(n.GetLastHeartbeatUnixNanos(), now))
	}
	return tw.Flush()
}

// printPendingTable lists NEW nodes with what the owner checks before
// approving them.
func printPendingTable(w io.Writer, nodes []*clusterpb.Node) error {
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "ID\tPUBLIC KEY\tADDRESS\tTPM")
	for _, n := range nodes {
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\n", n.GetId(), hex.EncodeToString(n.GetPublicKey()),
			orDash(strings.Join(n.GetStatus().GetAddresses(), ",")), shortTPM(n.GetTpmUsage()))
	}
	return tw.Flush()
}

// membership is the ETCD column: voter, learner, pending (the curator
// adds the member once the learner before it caught up) or -.
// versionText is the VERSION column: the version, its slot, and a
// pending ("→ v2") or failed ("v2 failed") update.
func versionText(st *clusterpb.NodeStatus) string {
	v := orDash(st.GetVersion())
	sw := st.GetSoftware()
	if sw == nil {
		return v
	}
	v += " (" + sw.GetSlot() + ")"
	if p := sw.GetPending(); p != nil {
		v += " → " + p.GetVersion() + " " + p.GetPhase()
	} else if f := sw.GetLastFailed(); f != nil {
		v += ", " + f.GetVersion() + " failed"
	}
	return v
}

func membership(n *clusterpb.Node) string {
	switch n.GetConsensusMembership() {
	case clusterpb.ConsensusMembership_CONSENSUS_MEMBERSHIP_VOTER:
		return "voter"
	case clusterpb.ConsensusMembership_CONSENSUS_MEMBERSHIP_LEARNER:
		return "learner"
	}
	if n.GetConsensusMemberPending() {
		return "pending"
	}
	return "-"
}

func describeNode(w io.Writer, n *clusterpb.Node, now time.Time) {
	st := n.GetStatus()
	boot := "-"
	if t := st.GetBootTimeUnixNanos(); t != 0 {
		boot = time.Unix(0, t).UTC().Format(time.RFC3339)
	}
	fmt.Fprintf(w, "ID:          %s\nPublic key:  %s\nState:       %s\nHealth:      %s (last heartbeat %s)\nTPM:         %s\n",
		n.GetId(), hex.EncodeToString(n.GetPublicKey()), shortState(n.GetState()), shortHealth(n.GetHealth()),
		lastSeen(n.GetLastHeartbeatUnixNanos(), now), shortTPM(n.GetTpmUsage()))
	fmt.Fprintf(w, "Addresses:   %s\nVersion:     %s\nBoot count:  %d\nBooted at:   %s\nRoles:       %s\n",
		orDash(strings.Join(st.GetAddresses(), ", ")), orDash(st.GetVersion()), st.GetBootCount(), boot,
		orDash(strings.Join(roleNames(n.GetRoles()), ", ")))
	switch m := membership(n); m {
	case "pending":
		fmt.Fprintf(w, "etcd:        pending (consensus-member given; the curator adds it once the current learner caught up)\n")
	default:
		fmt.Fprintf(w, "etcd:        %s\n", m)
	}
	if sw := st.GetSoftware(); sw != nil {
		fmt.Fprintf(w, "Slot:        %s (board %s)\n", sw.GetSlot(), orDash(sw.GetBoard()))
		if p := sw.GetPending(); p != nil {
			fmt.Fprintf(w, "Update:      %s\n", pendingText(p))
		}
		if f := sw.GetLastFailed(); f != nil {
			fmt.Fprintf(w, "Failed:      update to %s (slot %s) at %s: %s\n", f.GetVersion(), f.GetSlot(), time.Unix(0, f.GetTimeUnixNanos()).UTC().Format(time.RFC3339), f.GetReason())
		}
	}
	for _, p := range st.GetProblems() {
		fmt.Fprintf(w, "Problem:     %s: %s (since %s)\n", p.GetComponent(), p.GetMessage(), time.Unix(0, p.GetSinceUnixNanos()).UTC().Format(time.RFC3339))
	}
	if cm := n.GetRoles().GetConsensusMember(); cm != nil {
		for _, p := range cm.GetPeers() {
			fmt.Fprintf(w, "  consensus peer %s %s\n", p.GetName(), p.GetUrl())
		}
	}
}

// printJSON prints nodes as a JSON array, or one node as an object, with
// protojson's field names and stable formatting.
func printJSON(w io.Writer, nodes []*clusterpb.Node, array bool) error {
	raws := make([]json.RawMessage, 0, len(nodes))
	for _, n := range nodes {
		b, err := protojson.Marshal(n)
		if err != nil {
			return err
		}
		raws = append(raws, b)
	}
	var v any = raws
	if !array {
		v = raws[0]
	}
	out, err := json.MarshalIndent(v, "", "  ")
	if err != nil {
		return err
	}
	_, err = fmt.Fprintf(w, "%s\n", out)
	return err
}

// formatLogEntry prints an entry like the node's console does, with a
// timestamp in front.
func formatLogEntry(e *clusterpb.LogEntry) string {
	level := e.GetLevel()
	if level != "" && level != "RAW" {
		level = level[:1]
	}
	var b strings.Builder
	b.WriteString(time.Unix(0, e.GetTimeUnixNanos()).Format("2006-01-02 15:04:05.000000 "))
	if level != "" {
		b.WriteString(level + " ")
	}
	b.WriteString(e.GetDn() + ": " + e.GetMessage())
	for _, a := range e.GetAttributes() {
		b.WriteString(" " + a)
	}
	return b.String()
}
