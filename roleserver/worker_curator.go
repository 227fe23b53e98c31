package roleserver

import (
	"context"
	"fmt"
	"net"
	"strconv"

	"google.golang.org/grpc/credentials"

	"plinth.dev/plinth/api/clusterpb"
	"plinth.dev/plinth/platform/event/memory"
	"plinth.dev/plinth/platform/supervisor"
	"plinth.dev/plinth/roleserver/identity"
	"plinth.dev/plinth/roleserver/rpc"
)

// workerCurator builds the connection to the curator leader once the node
// has credentials, and keeps this node's own curator among the resolver's
// endpoints while it runs. Service.Run runs it itself, after starting the
// other workers: the connection lives as long as the Role Server, and a
// failure to build it restarts the whole Role Server.
//
// It consumes the node data (the directory known at enrolment), the
// credentials and the control plane. It produces the curator connection
// (CuratorConnection, nil again when it ends) and the resolver's
// directory, fallback and local endpoints (endpoints).
type workerCurator struct {
	// inputs
	node         *memory.Value[*nodeData]
	credentials  *memory.Value[*identity.Credentials]
	controlPlane *memory.Value[*ControlPlane]
	// fallback are the node parameters' curator endpoints
	// (Config.CuratorEndpoints); curatorPort is every node's curator port
	// and localCurator how this node reaches its own.
	fallback     []string
	curatorPort  int
	localCurator string

	// outputs
	curator   *memory.Value[*CuratorConnection]
	endpoints *resolverEndpoints
}

func (w *workerCurator) run(ctx context.Context) error {
	log := supervisor.Logger(ctx)
	if get(w.node) == nil {
		log.Info("waiting for cluster enrolment (bootstrap, register or join)")
	}
	nd, err := wait(ctx, w.node)
	if err != nil {
		return err
	}
	log.Info("node identity known", "node", nd.nodeID)
	creds, err := wait(ctx, w.credentials)
	if err != nil {
		return err
	}
	res := rpc.NewResolver(log, func() credentials.TransportCredentials {
		return credentials.NewTLS(creds.ClientTLSConfig(identity.ServerCurator))
	})
	defer res.Close()
	// The directory saved at registration first, then the parameters'
	// endpoints: the directory may name only curators that have since
	// moved or lost the role.
	w.endpoints.update(res, func(e *curatorEndpoints) {
		e.directory = w.directoryEndpoints(nd.directory)
		e.fallback = w.fallback
	})
	conn, err := res.Dial()
	if err != nil {
		return fmt.Errorf("roleserver: curator connection: %w", err)
	}
	defer conn.Close()
	w.curator.Set(&CuratorConnection{Credentials: creds, Resolver: res, Conn: conn})
	defer w.curator.Set(nil)
	return w.followLocalCurator(ctx, res)
}

// followLocalCurator makes the local curator an endpoint while it runs.
func (w *workerCurator) followLocalCurator(ctx context.Context, res *rpc.Resolver) error {
	log := supervisor.Logger(ctx)
	cw := w.controlPlane.Watch()
	defer cw.Close()
	var logged string
	for {
		cp, err := cw.Get(ctx)
		if err != nil {
			return err
		}
		w.endpoints.update(res, func(e *curatorEndpoints) {
			e.local = ""
			if cp != nil && cp.Running {
				e.local = w.localCurator
			}
		})
		if eps := fmt.Sprint(res.Endpoints()); eps != logged {
			log.Info("looking for the curator leader", "endpoints", eps)
			logged = eps
		}
	}
}

// directoryEndpoints are the curator endpoints of a directory.
func (w *workerCurator) directoryEndpoints(dir *clusterpb.ClusterDirectory) []string {
	var out []string
	for _, n := range dir.GetNodes() {
		for _, a := range n.GetAddresses() {
			out = append(out, net.JoinHostPort(a, strconv.Itoa(w.curatorPort)))
		}
	}
	return out
}
