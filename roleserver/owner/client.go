package owner

import (
	"bytes"
	"context"
	"crypto/ed25519"
	"crypto/x509"
	"encoding/base64"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"maps"
	"net"
	"slices"
	"strconv"
	"strings"
	"sync"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/status"

	"plinth.dev/plinth/api/clusterpb"
	"plinth.dev/plinth/api/nodepb"
	"plinth.dev/plinth/platform/layout"
	"plinth.dev/plinth/platform/pki"
	"plinth.dev/plinth/roleserver/identity"
)

// Client calls the cluster as its owner. Connections are made on first
// use; a Client is safe for concurrent use.
type Client struct {
	creds *identity.Credentials
	// dir is the configuration directory the cluster's CRL is kept in
	// ("": not kept).
	dir string
	// crlChecked: the cluster's CRL was asked for once (management).
	crlChecked bool

	mu            sync.Mutex
	endpoints     []string          // curator endpoints, in order
	nodeEndpoints map[string]string // NodeManagement overrides
	curators      map[string]*grpc.ClientConn
	nodes         map[string]*grpc.ClientConn // by node endpoint + ID
	preferred     int                         // index in cfg.Curators that last answered
	closed        bool
}

// ErrNotOwner is returned by Dial for a configuration without owner
// credentials.
var ErrNotOwner = errors.New("owner: no owner certificate in the configuration (run plinthctl cluster takeownership first)")

// Dial returns a client using cfg's credentials and endpoints (copied:
// later changes to cfg do not reach the client; see SetCurators and
// SetNodeEndpoint).
func Dial(cfg *Config) (*Client, error) {
	if cfg.Credentials == nil {
		return nil, ErrNotOwner
	}
	if len(cfg.Curators) == 0 {
		return nil, fmt.Errorf("owner: no curator endpoints in %s", cfg.Dir)
	}
	c := &Client{creds: cfg.Credentials, dir: cfg.Dir, endpoints: slices.Clone(cfg.Curators), nodeEndpoints: maps.Clone(cfg.NodeEndpoints),
		curators: map[string]*grpc.ClientConn{}, nodes: map[string]*grpc.ClientConn{}}
	if c.nodeEndpoints == nil {
		c.nodeEndpoints = map[string]string{}
	}
	return c, nil
}

// Close closes every connection.
func (c *Client) Close() error {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.closed = true
	var errs []error
	for _, m := range []map[string]*grpc.ClientConn{c.curators, c.nodes} {
		for k, cc := range m {
			errs = append(errs, cc.Close())
			delete(m, k)
		}
	}
	return errors.Join(errs...)
}

// SetNodeEndpoint overrides where node id's NodeManagement is reached.
func (c *Client) SetNodeEndpoint(id, hostport string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.nodeEndpoints[id] = hostport
}

// SetCurators replaces the curator endpoints.
func (c *Client) SetCurators(endpoints []string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if !slices.Equal(c.endpoints, endpoints) {
		c.endpoints, c.preferred = slices.Clone(endpoints), 0
	}
}

func (c *Client) curatorConn(ep string) (*grpc.ClientConn, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.closed {
		return nil, errors.New("owner: client closed")
	}
	if cc := c.curators[ep]; cc != nil {
		return cc, nil
	}
	cc, err := dial(ep, credentials.NewTLS(c.creds.ClientTLSConfig(identity.ServerCurator)))
	if err != nil {
		return nil, err
	}
	c.curators[ep] = cc
	return cc, nil
}

// management runs fn against the configured curators, starting with the
// one that last answered; an UNAVAILABLE error (endpoint down, or a
// curator that cannot serve the call right now) moves on to the next.
// fn must be safe to repeat.
func (c *Client) management(ctx context.Context, fn func(clusterpb.ManagementClient) error) error {
	c.mu.Lock()
	eps, start := c.endpoints, c.preferred
	c.mu.Unlock()
	if len(eps) == 0 {
		return status.Error(codes.Unavailable, "owner: no curator endpoints")
	}
	var errs []error
	for i := range eps {
		k := (start + i) % len(eps)
		cc, err := c.curatorConn(eps[k])
		if err != nil {
			return err
		}
		err = fn(clusterpb.NewManagementClient(cc))
		if status.Code(err) != codes.Unavailable || ctx.Err() != nil {
			if err == nil {
				c.refreshCRL(ctx, clusterpb.NewManagementClient(cc))
				c.mu.Lock()
				if slices.Equal(c.endpoints, eps) {
					c.preferred = k
				}
				c.mu.Unlock()
			}
			return err
		}
		errs = append(errs, fmt.Errorf("%s: %w", eps[k], err))
	}
	return status.Errorf(codes.Unavailable, "no curator answered: %v", errors.Join(errs...))
}

// ClusterInfo returns the directory, CA and policy.
func (c *Client) ClusterInfo(ctx context.Context) (*clusterpb.GetClusterInfoResponse, error) {
	var out *clusterpb.GetClusterInfoResponse
	err := c.management(ctx, func(m clusterpb.ManagementClient) (err error) {
		out, err = m.GetClusterInfo(ctx, &clusterpb.GetClusterInfoRequest{})
		return err
	})
	if err == nil {
		err = c.acceptCRL(out.GetCrl())
	}
	return out, err
}

// refreshCRL asks m for the cluster's CRL once per client, after its
// first call went through: every later handshake is checked against it,
// and it is kept for the next run (acceptCRL). A failure only means the
// CRL held stays.
func (c *Client) refreshCRL(ctx context.Context, m clusterpb.ManagementClient) {
	c.mu.Lock()
	done := c.crlChecked
	c.crlChecked = true
	c.mu.Unlock()
	if done {
		return
	}
	if info, err := m.GetClusterInfo(ctx, &clusterpb.GetClusterInfoRequest{}); err == nil {
		c.acceptCRL(info.GetCrl())
	}
}

// Nodes returns every node the cluster knows.
func (c *Client) Nodes(ctx context.Context) ([]*clusterpb.Node, error) {
	var out []*clusterpb.Node
	err := c.management(ctx, func(m clusterpb.ManagementClient) error {
		out = nil
		ctx, cancel := context.WithCancel(ctx)
		defer cancel()
		s, err := m.GetNodes(ctx, &clusterpb.GetNodesRequest{})
		if err != nil {
			return err
		}
		for {
			n, err := s.Recv()
			if errors.Is(err, io.EOF) {
				return nil
			}
			if err != nil {
				return err
			}
			out = append(out, n)
		}
	})
	return out, err
}

// FindNode returns the node named by ref: its ID (with or without the
// "plinth-" prefix), a unique prefix of the ID, or its public key in hex
// or base64.
func (c *Client) FindNode(ctx context.Context, ref string) (*clusterpb.Node, error) {
	nodes, err := c.Nodes(ctx)
	if err != nil {
		return nil, err
	}
	return MatchNode(nodes, ref)
}

// MatchNode is FindNode on a node list.
func MatchNode(nodes []*clusterpb.Node, ref string) (*clusterpb.Node, error) {
	pub, _ := ParsePublicKey(ref)
	var prefixed []*clusterpb.Node
	for _, n := range nodes {
		if n.GetId() == ref || n.GetId() == "plinth-"+ref || (pub != nil && pub.Equal(ed25519.PublicKey(n.GetPublicKey()))) {
			return n, nil
		}
		if len(ref) >= 4 && (strings.HasPrefix(n.GetId(), ref) || strings.HasPrefix(n.GetId(), "plinth-"+ref)) {
			prefixed = append(prefixed, n)
		}
	}
	switch len(prefixed) {
	case 1:
		return prefixed[0], nil
	case 0:
		return nil, fmt.Errorf("owner: no node %q in the cluster", ref)
	}
	return nil, fmt.Errorf("owner: %q matches %d nodes", ref, len(prefixed))
}

// ParsePublicKey reads an ed25519 public key in hex or (std or URL)
// base64.
func ParsePublicKey(s string) (ed25519.PublicKey, error) {
	if b, err := hex.DecodeString(s); err == nil && len(b) == ed25519.PublicKeySize {
		return b, nil
	}
	for _, enc := range []*base64.Encoding{base64.StdEncoding, base64.RawStdEncoding, base64.URLEncoding, base64.RawURLEncoding} {
		if b, err := enc.DecodeString(s); err == nil && len(b) == ed25519.PublicKeySize {
			return b, nil
		}
	}
	return nil, fmt.Errorf("owner: %q is not a 32-byte ed25519 public key in hex or base64", s)
}

// Approve lets the NEW node with this key proceed.
func (c *Client) Approve(ctx context.Context, pub ed25519.PublicKey) error {
	return c.management(ctx, func(m clusterpb.ManagementClient) error {
		_, err := m.ApproveNode(ctx, &clusterpb.ApproveNodeRequest{PublicKey: pub})
		return err
	})
}

// Decommission removes a node from the cluster for good: it can never
// rejoin, and the cluster no longer hands out its cluster unlock key.
func (c *Client) Decommission(ctx context.Context, id string) error {
	return c.management(ctx, func(m clusterpb.ManagementClient) error {
		_, err := m.DecommissionNode(ctx, &clusterpb.DecommissionNodeRequest{Id: id})
		return err
	})
}

// UpdateRoles changes a node's roles (see UpdateNodeRolesRequest).
func (c *Client) UpdateRoles(ctx context.Context, req *clusterpb.UpdateNodeRolesRequest) error {
	return c.management(ctx, func(m clusterpb.ManagementClient) error {
		_, err := m.UpdateNodeRoles(ctx, req)
		return err
	})
}

// Ticket returns the cluster's register ticket.
func (c *Client) Ticket(ctx context.Context) ([]byte, error) {
	var out []byte
	err := c.management(ctx, func(m clusterpb.ManagementClient) error {
		r, err := m.GetRegisterTicket(ctx, &clusterpb.GetRegisterTicketRequest{})
		out = r.GetTicket()
		return err
	})
	return out, err
}

// RotateTicket replaces the cluster's register ticket with a new random
// one and returns it. The old ticket stops working at once; nodes that
// registered with it are not affected. Like every Management call it may
// be retried on the next curator after UNAVAILABLE, so a rotation whose
// reply was lost may rotate twice: the ticket returned is the current one
// either way.
func (c *Client) RotateTicket(ctx context.Context) ([]byte, error) {
	var out []byte
	err := c.management(ctx, func(m clusterpb.ManagementClient) error {
		r, err := m.RotateRegisterTicket(ctx, &clusterpb.RotateRegisterTicketRequest{})
		out = r.GetTicket()
		return err
	})
	if err == nil && len(out) == 0 {
		return nil, errors.New("owner: the cluster returned an empty register ticket")
	}
	return out, err
}

// ErrCAMismatch is returned by RegisterParameters when the cluster reports
// another CA than the one pinned in the owner's configuration.
var ErrCAMismatch = errors.New("owner: the cluster reports another CA than the one pinned at takeownership")

// RegisterParameters returns what a new node's parameters need to
// register: the cluster CA pinned in the owner's configuration (never the
// one the server reports, which must equal it), the ticket and the
// curators' addresses from the directory (with layout.CuratorPort).
func (c *Client) RegisterParameters(ctx context.Context) (*nodepb.Register, error) {
	info, err := c.ClusterInfo(ctx)
	if err != nil {
		return nil, err
	}
	pinned := c.creds.CA
	if !bytes.Equal(info.GetCaCertificate(), pinned.Raw) {
		reported := "an unparsable certificate"
		if ca, err := x509.ParseCertificate(info.GetCaCertificate()); err == nil {
			reported = "fingerprint " + pki.Fingerprint(ca)
		}
		return nil, fmt.Errorf("%w: pinned fingerprint %s, reported %s", ErrCAMismatch, pki.Fingerprint(pinned), reported)
	}
	ticket, err := c.Ticket(ctx)
	if err != nil {
		return nil, err
	}
	r := &nodepb.Register{ClusterCaCertificate: pinned.Raw, RegisterTicket: ticket}
	for _, n := range info.GetDirectory().GetNodes() {
		for _, a := range n.GetAddresses() {
			r.CuratorEndpoints = append(r.CuratorEndpoints, net.JoinHostPort(a, strconv.Itoa(layout.CuratorPort)))
		}
	}
	if len(r.CuratorEndpoints) == 0 {
		return nil, errors.New("owner: the cluster directory lists no curator addresses")
	}
	return r, nil
}

// nodeConn connects to node id's NodeManagement service and insists that
// the server presents that node's certificate.
func (c *Client) nodeConn(ctx context.Context, id string) (*grpc.ClientConn, error) {
	c.mu.Lock()
	ep := c.nodeEndpoints[id]
	c.mu.Unlock()
	if ep == "" {
		nodes, err := c.Nodes(ctx)
		if err != nil {
			return nil, err
		}
		n, err := MatchNode(nodes, id)
		if err != nil {
			return nil, err
		}
		if n.GetId() != id {
			return nil, fmt.Errorf("owner: %q is not a node ID (did you mean %s?)", id, n.GetId())
		}
		addrs := n.GetStatus().GetAddresses()
		if len(addrs) == 0 {
			return nil, fmt.Errorf("owner: node %s has reported no address", id)
		}
		ep = net.JoinHostPort(addrs[0], strconv.Itoa(layout.NodeManagementPort))
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.closed {
		return nil, errors.New("owner: client closed")
	}
	key := id + " " + ep
	if cc := c.nodes[key]; cc != nil {
		return cc, nil
	}
	cfg := c.creds.ClientTLSConfig(identity.ServerNode)
	cfg.VerifyPeerCertificate = verifyNode(id, cfg.VerifyPeerCertificate)
	cc, err := dial(ep, credentials.NewTLS(cfg))
	if err != nil {
		return nil, err
	}
	c.nodes[key] = cc
	return cc, nil
}

// verifyNode adds "and it is node id" to a cluster server check.
func verifyNode(id string, chain func([][]byte, [][]*x509.Certificate) error) func([][]byte, [][]*x509.Certificate) error {
	return func(raw [][]byte, v [][]*x509.Certificate) error {
		if err := chain(raw, v); err != nil {
			return err
		}
		cert, err := x509.ParseCertificate(raw[0])
		if err != nil {
			return err
		}
		if cert.Subject.CommonName != id {
			return fmt.Errorf("owner: reached node %s, want %s", cert.Subject.CommonName, id)
		}
		return nil
	}
}

// Logs streams node id's log entries to fn until the server ends the
// stream (without req.Follow, after the backlog), fn fails or ctx ends.
func (c *Client) Logs(ctx context.Context, id string, req *clusterpb.LogsRequest, fn func(*clusterpb.LogEntry) error) error {
	cc, err := c.nodeConn(ctx, id)
	if err != nil {
		return err
	}
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	s, err := clusterpb.NewNodeManagementClient(cc).Logs(ctx, req)
	if err != nil {
		return err
	}
	for {
		r, err := s.Recv()
		if errors.Is(err, io.EOF) {
			return nil
		}
		if err != nil {
			return err
		}
		for _, e := range r.GetEntries() {
			if err := fn(e); err != nil {
				return err
			}
		}
	}
}

// NodeStatus asks node id for its status and supervisor runnables.
func (c *Client) NodeStatus(ctx context.Context, id string) (*clusterpb.StatusResponse, error) {
	cc, err := c.nodeConn(ctx, id)
	if err != nil {
		return nil, err
	}
	return clusterpb.NewNodeManagementClient(cc).Status(ctx, &clusterpb.StatusRequest{})
}

// Reboot asks node id to reboot.
func (c *Client) Reboot(ctx context.Context, id string) error {
	cc, err := c.nodeConn(ctx, id)
	if err != nil {
		return err
	}
	_, err = clusterpb.NewNodeManagementClient(cc).Reboot(ctx, &clusterpb.RebootRequest{})
	return err
}

// PowerOff asks node id to shut down.
func (c *Client) PowerOff(ctx context.Context, id string) error {
	cc, err := c.nodeConn(ctx, id)
	if err != nil {
		return err
	}
	_, err = clusterpb.NewNodeManagementClient(cc).PowerOff(ctx, &clusterpb.PowerOffRequest{})
	return err
}
