package rpc

import (
	"context"
	"crypto/x509"
	"errors"
	"fmt"
	"strings"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protoreflect"
	"google.golang.org/protobuf/reflect/protoregistry"
	"google.golang.org/protobuf/types/descriptorpb"

	"plinth.dev/plinth/api/clusterpb"
	"plinth.dev/plinth/roleserver/identity"
)

// permissions is the whole policy: which kind of caller holds which
// permission. Kept as one literal so it can be audited at a glance.
var permissions = map[identity.Kind][]clusterpb.Permission{
	identity.KindOwner: {
		clusterpb.Permission_GET_REGISTER_TICKET,
		clusterpb.Permission_READ_CLUSTER_STATUS,
		clusterpb.Permission_UPDATE_NODE_ROLES,
		clusterpb.Permission_APPROVE_NODE,
		clusterpb.Permission_DECOMMISSION_NODE,
		clusterpb.Permission_READ_NODE_LOGS,
		clusterpb.Permission_NODE_POWER,
	},
	identity.KindNode: {
		clusterpb.Permission_READ_CLUSTER_STATUS,
		clusterpb.Permission_UPDATE_NODE_SELF,
	},
	identity.KindEphemeral: {
		clusterpb.Permission_REGISTER_NODE,
		clusterpb.Permission_ESCROW_OWNERSHIP,
	},
}

// Permitted reports whether a caller of kind holds permission p.
// Unauthenticated callers and PERMISSION_UNSPECIFIED are never permitted.
func Permitted(kind identity.Kind, p clusterpb.Permission) bool {
	if p == clusterpb.Permission_PERMISSION_UNSPECIFIED {
		return false
	}
	for _, q := range permissions[kind] {
		if q == p {
			return true
		}
	}
	return false
}

// RequiredPermission returns the permission the method named by a gRPC full
// method name ("/plinth.cluster.v1.Curator/Watch") declares in its
// required_permission option. A method that is unknown, has no option or
// an unknown value is an error, which callers treat as "deny".
func RequiredPermission(fullMethod string) (clusterpb.Permission, error) {
	unspecified := clusterpb.Permission_PERMISSION_UNSPECIFIED
	svc, method, ok := strings.Cut(strings.TrimPrefix(fullMethod, "/"), "/")
	if !ok || svc == "" || method == "" || strings.Contains(method, "/") {
		return unspecified, fmt.Errorf("rpc: malformed method name %q", fullMethod)
	}
	d, err := protoregistry.GlobalFiles.FindDescriptorByName(protoreflect.FullName(svc))
	if err != nil {
		return unspecified, fmt.Errorf("rpc: service %s: %w", svc, err)
	}
	sd, ok := d.(protoreflect.ServiceDescriptor)
	if !ok {
		return unspecified, fmt.Errorf("rpc: %s is not a service", svc)
	}
	md := sd.Methods().ByName(protoreflect.Name(method))
	if md == nil {
		return unspecified, fmt.Errorf("rpc: service %s has no method %s", svc, method)
	}
	opts, ok := md.Options().(*descriptorpb.MethodOptions)
	if !ok || opts == nil || !proto.HasExtension(opts, clusterpb.E_RequiredPermission) {
		return unspecified, fmt.Errorf("rpc: %s declares no required_permission", md.FullName())
	}
	p, ok := proto.GetExtension(opts, clusterpb.E_RequiredPermission).(clusterpb.Permission)
	if !ok || p == unspecified || clusterpb.Permission_name[int32(p)] == "" {
		return unspecified, fmt.Errorf("rpc: %s declares an invalid required_permission", md.FullName())
	}
	return p, nil
}

// Authorizer is the server-side permission check.
type Authorizer struct {
	ca func() *x509.Certificate
}

// NewAuthorizer checks callers against the cluster CA returned by ca (a
// function so that a server started before the CA is known, or across a
// CA change, always uses the current one).
func NewAuthorizer(ca func() *x509.Certificate) *Authorizer {
	return &Authorizer{ca: ca}
}

type peerKey struct{}

// PeerFrom returns the caller the authorizer established, or nil outside a
// call that went through it.
func PeerFrom(ctx context.Context) *identity.Peer {
	p, _ := ctx.Value(peerKey{}).(*identity.Peer)
	return p
}

// authorize classifies the caller and checks the method's permission.
func (a *Authorizer) authorize(ctx context.Context, fullMethod string) (context.Context, error) {
	var ca *x509.Certificate
	if a.ca != nil {
		ca = a.ca()
	}
	p, err := identity.PeerFromContext(ctx, ca)
	if err != nil || p.Kind == identity.KindUnauthenticated {
		if err == nil {
			err = identity.ErrUnauthenticated
		}
		return nil, status.Errorf(codes.Unauthenticated, "%s: %v", fullMethod, err)
	}
	perm, err := RequiredPermission(fullMethod)
	if err != nil {
		return nil, status.Errorf(codes.PermissionDenied, "%s: denied: %v", fullMethod, err)
	}
	if !Permitted(p.Kind, perm) {
		return nil, status.Errorf(codes.PermissionDenied, "%s requires permission %s, which a caller of kind %s does not have", fullMethod, perm, p.Kind)
	}
	return context.WithValue(ctx, peerKey{}, p), nil
}

// Unary is the grpc.UnaryServerInterceptor of the authorizer.
func (a *Authorizer) Unary() grpc.UnaryServerInterceptor {
	return func(ctx context.Context, req any, info *grpc.UnaryServerInfo, handler grpc.UnaryHandler) (any, error) {
		ctx, err := a.authorize(ctx, info.FullMethod)
		if err != nil {
			return nil, err
		}
		return handler(ctx, req)
	}
}

// Stream is the grpc.StreamServerInterceptor of the authorizer.
func (a *Authorizer) Stream() grpc.StreamServerInterceptor {
	return func(srv any, ss grpc.ServerStream, info *grpc.StreamServerInfo, handler grpc.StreamHandler) error {
		ctx, err := a.authorize(ss.Context(), info.FullMethod)
		if err != nil {
			return err
		}
		return handler(srv, &authorizedStream{ServerStream: ss, ctx: ctx})
	}
}

// ServerOptions are the interceptor options of the authorizer, for a
// server that sets up its own transport credentials.
func (a *Authorizer) ServerOptions() []grpc.ServerOption {
	return []grpc.ServerOption{grpc.ChainUnaryInterceptor(a.Unary()), grpc.ChainStreamInterceptor(a.Stream())}
}

type authorizedStream struct {
	grpc.ServerStream
	ctx context.Context
}

func (s *authorizedStream) Context() context.Context { return s.ctx }

// NewServer is a gRPC server serving TLS with creds (node credentials),
// with every call checked by an Authorizer trusting creds.CA and the
// cluster's keepalives (ServerKeepalive). extra options are appended (more
// interceptors run after the authorizer).
func NewServer(creds *identity.Credentials, extra ...grpc.ServerOption) *grpc.Server {
	if creds == nil {
		panic(errors.New("rpc: NewServer needs credentials"))
	}
	a := NewAuthorizer(func() *x509.Certificate { return creds.CA })
	opts := append([]grpc.ServerOption{grpc.Creds(credentials.NewTLS(creds.ServerTLSConfig()))}, a.ServerOptions()...)
	return grpc.NewServer(append(append(opts, ServerKeepalive()...), extra...)...)
}
