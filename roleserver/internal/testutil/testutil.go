// Package testutil holds helpers that the tests of several roleserver
// packages share: running real consensus members in one process, on
// loopback ports, with short raft timings.
//
// It exists so that production packages carry no exported function whose
// only purpose is tests: they expose small, documented settings (such as
// consensus.Config.Tuning and consensus.PeerAddress), and the test values
// for them live here. Only _test.go files import this package; /init never
// links it (TestNotImportedByProduction checks that no non-test package
// does).
package testutil

import (
	"net"
	"strconv"
	"time"

	"plinth.dev/plinth/roleserver/consensus"
)

// LoopbackTuning is the consensus tuning of a test member: its peer
// listener on 127.0.0.1:peerPort (also the advertised peer address), fast
// raft timings (tick 10 ms, election 100 ms), a 100 ms autopromoter, no
// fsync and a short ready timeout.
func LoopbackTuning(peerPort int) consensus.Tuning {
	addr := net.JoinHostPort("127.0.0.1", strconv.Itoa(peerPort))
	return consensus.Tuning{
		PeerListen:      addr,
		PeerAdvertise:   addr,
		TickMs:          10,
		ElectionMs:      100,
		ReadyTimeout:    20 * time.Second,
		PromoteInterval: 100 * time.Millisecond,
		NoFsync:         true,
	}
}

// NewLoopbackConsensus is consensus.New with LoopbackTuning(peerPort).
// cfg's Data, Ephemeral, NodeID, NodePrivateKey and JoinCluster are used
// as given. Keep the Ephemeral directory short: the client socket path is
// limited to ~107 bytes.
func NewLoopbackConsensus(cfg consensus.Config, peerPort int) *consensus.Service {
	cfg.Tuning = LoopbackTuning(peerPort)
	return consensus.New(cfg)
}

// LoopbackPeer makes AddNode register the new member at
// https://127.0.0.1:port, matching a member started by
// NewLoopbackConsensus with that peer port.
func LoopbackPeer(port int) *consensus.AddNodeOption {
	return consensus.PeerAddress("127.0.0.1", port)
}
