package consensus

import (
	"net"
	"strconv"
	"time"
)

// Helpers for tests of other packages (the curator, the role server) that
// run real consensus members in one process. Production code never calls
// them: they set the unexported knobs that production leaves zero.

// NewLoopbackForTest is New with the member's peer listener on
// 127.0.0.1:peerPort (also the advertised peer address), fast raft timings
// (tick 10 ms, election 100 ms), a 100 ms autopromoter, no fsync and a
// short ready timeout. cfg's Data, Ephemeral, NodeID, NodePrivateKey and
// JoinCluster are used as given. Keep the Ephemeral directory short: the
// client socket path is limited to ~107 bytes.
func NewLoopbackForTest(cfg Config, peerPort int) *Service {
	addr := net.JoinHostPort("127.0.0.1", strconv.Itoa(peerPort))
	cfg.knobs = knobs{
		peerListen:      addr,
		peerAdvertise:   addr,
		tickMs:          10,
		electionMs:      100,
		readyTimeout:    20 * time.Second,
		promoteInterval: 100 * time.Millisecond,
		noFsync:         true,
	}
	return New(cfg)
}

// LoopbackPeerForTest makes AddNode register the new member at
// https://127.0.0.1:port, matching a member started by NewLoopbackForTest
// with that peer port.
func LoopbackPeerForTest(port int) *AddNodeOption {
	return &AddNodeOption{peerHost: "127.0.0.1", peerPort: port}
}
