package rpc

import (
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/backoff"
	"google.golang.org/grpc/keepalive"
)

// Keepalives: every gRPC server and client of the cluster uses the
// settings below, so that a connection whose peer vanished (power cut,
// QEMU killed, cable pulled: no FIN, no RST, packets just disappear) fails
// within seconds instead of when TCP gives up (~15 minutes, and never for
// a connection that has nothing to send, like an idle watch).
//
//	client                                         server
//	  │ ── PING after ClientTime without reading ──►  │  EnforcementPolicy: a ping is
//	  │ ◄── PING ack within ClientTimeout ────────── │  fine every MinTime (< ClientTime),
//	  │     (none: connection closed, every stream   │  also without streams: our own
//	  │      on it fails UNAVAILABLE)                │  clients are never GOAWAYed with
//	  │ ◄── PING after ServerTime without reading ── │  "too_many_pings"
//	  │ ── ack within ServerTimeout ───────────────► │  (none: the server drops the
//	                                                    client and its streams)
//
// gRPC raises a client ping interval below 10 s to 10 s, so a silent dead
// server is noticed after at most ClientTime + ClientTimeout. A connection
// that carries data notices sooner: gRPC sets TCP_USER_TIMEOUT to
// ClientTimeout on client sockets, so unacknowledged data (a heartbeat)
// kills the connection ClientTimeout after it was sent. The server's pings
// count as reads on the client, so a live server keeps an idle client from
// having to ping at all.
const (
	ClientTime    = 10 * time.Second
	ClientTimeout = 5 * time.Second
	ServerTime    = 5 * time.Second
	ServerTimeout = 5 * time.Second
	// MinPingInterval is the shortest interval between client pings a
	// server accepts; below ClientTime with room for timer jitter.
	MinPingInterval = 4 * time.Second
	// ConnectTimeout bounds establishing one connection (TCP and TLS), so
	// that a dial to a dead host fails over to the next endpoint quickly.
	ConnectTimeout = 5 * time.Second
)

// ServerKeepalive returns the keepalive options of every cluster server.
func ServerKeepalive() []grpc.ServerOption {
	return []grpc.ServerOption{
		grpc.KeepaliveParams(keepalive.ServerParameters{Time: ServerTime, Timeout: ServerTimeout}),
		grpc.KeepaliveEnforcementPolicy(keepalive.EnforcementPolicy{MinTime: MinPingInterval, PermitWithoutStream: true}),
	}
}

// ClientKeepalive is the keepalive option of every cluster client.
func ClientKeepalive() grpc.DialOption {
	return grpc.WithKeepaliveParams(keepalive.ClientParameters{Time: ClientTime, Timeout: ClientTimeout, PermitWithoutStream: true})
}

// ClientConnectParams bound a connection attempt by ConnectTimeout and
// keep reconnect attempts to a known endpoint at most a few seconds
// apart (gRPC's default backoff grows to two minutes, far longer than a
// node takes to reboot).
func ClientConnectParams() grpc.DialOption {
	return grpc.WithConnectParams(grpc.ConnectParams{
		Backoff:           backoff.Config{BaseDelay: 250 * time.Millisecond, Multiplier: 1.6, Jitter: 0.2, MaxDelay: 5 * time.Second},
		MinConnectTimeout: ConnectTimeout,
	})
}
