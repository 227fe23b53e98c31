package rpc

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"runtime/debug"
	"slices"
	"strings"
	"sync"

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

// grants is the policy as the .proto declares it: which caller kinds
// hold each permission (the granted_to option on every Permission value
// in api/cluster/v1/authorization.proto). Read once from the descriptors.
var grants = sync.OnceValue(func() map[clusterpb.Permission][]clusterpb.CallerKind {
	out := map[clusterpb.Permission][]clusterpb.CallerKind{}
	values := clusterpb.Permission_PERMISSION_UNSPECIFIED.Descriptor().Values()
	for i := 0; i < values.Len(); i++ {
		v := values.Get(i)
		out[clusterpb.Permission(v.Number())] = proto.GetExtension(v.Options(), clusterpb.E_GrantedTo).([]clusterpb.CallerKind)
	}
	return out
})

// callerKind is the API's name for an identity kind.
func callerKind(k identity.Kind) clusterpb.CallerKind {
	switch k {
	case identity.KindOwner:
		return clusterpb.CallerKind_CALLER_KIND_OWNER
	case identity.KindNode:
		return clusterpb.CallerKind_CALLER_KIND_NODE
	case identity.KindEphemeral:
		return clusterpb.CallerKind_CALLER_KIND_EPHEMERAL
	}
	return clusterpb.CallerKind_CALLER_KIND_UNSPECIFIED
}

// Permitted reports whether a caller of kind holds permission p, as the
// permission's granted_to option says. Unauthenticated callers and
// PERMISSION_UNSPECIFIED are never permitted.
func Permitted(kind identity.Kind, p clusterpb.Permission) bool {
	ck := callerKind(kind)
	if p == clusterpb.Permission_PERMISSION_UNSPECIFIED || ck == clusterpb.CallerKind_CALLER_KIND_UNSPECIFIED {
		return false
	}
	return slices.Contains(grants()[p], ck)
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

// Authorizer is the server-side permission check, the one place that
// decides who may call what: it classifies the caller from its TLS
// certificate (checking the CRL), looks up the method's
// required_permission, checks the caller's kind against the permission's
// granted_to, and then runs the service's CallerCheck. Handlers get the
// authenticated caller from PeerFrom and never decide again. It also
// turns a panic in a handler into an INTERNAL error, logged with its
// stack, instead of a crashed node.
type Authorizer struct {
	trust *identity.Trust
	log   *slog.Logger
	check CallerCheck
}

// CallerCheck is a service's own verification of an authenticated caller
// beyond its certificate, run on every call after the permission check:
// the curator checks a node caller against its record (the whole key, not
// decommissioned). A non-nil error refuses the call; return a status
// error (see Error) to choose its code.
type CallerCheck func(ctx context.Context, p *identity.Peer) error

// NewAuthorizer checks callers against trust (the cluster CA and the CRL
// held). log receives recovered panics; check may be nil.
func NewAuthorizer(trust *identity.Trust, log *slog.Logger, check CallerCheck) *Authorizer {
	if trust == nil {
		panic(errors.New("rpc: NewAuthorizer needs a trust"))
	}
	if log == nil {
		log = slog.Default()
	}
	return &Authorizer{trust: trust, log: log, check: check}
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
	p, err := identity.PeerFromContext(ctx, a.trust)
	if errors.Is(err, identity.ErrRevoked) {
		// Only a decommissioned node's node certificate is ever revoked
		// for a caller; saying so lets the node drop what it holds.
		return nil, Error(codes.PermissionDenied, clusterpb.ErrorReason_NODE_DECOMMISSIONED, "%s: %v (a decommissioned node's, or an owner key's that was replaced)", fullMethod, err)
	}
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
	if a.check != nil {
		if err := a.check(ctx, p); err != nil {
			if _, ok := status.FromError(err); !ok {
				err = status.Errorf(codes.PermissionDenied, "%s: %v", fullMethod, err)
			}
			return nil, err
		}
	}
	return context.WithValue(ctx, peerKey{}, p), nil
}

// recovered turns a panic into an INTERNAL error; use as
// `defer a.recovered(method, &err)`.
func (a *Authorizer) recovered(method string, err *error) {
	r := recover()
	if r == nil {
		return
	}
	a.log.Error("panic in gRPC handler", "method", method, "panic", fmt.Sprint(r), "stack", string(debug.Stack()))
	*err = status.Errorf(codes.Internal, "%s: internal error (the server logged it)", method)
}

// Unary is the grpc.UnaryServerInterceptor of the authorizer.
func (a *Authorizer) Unary() grpc.UnaryServerInterceptor {
	return func(ctx context.Context, req any, info *grpc.UnaryServerInfo, handler grpc.UnaryHandler) (_ any, err error) {
		defer a.recovered(info.FullMethod, &err)
		ctx, err = a.authorize(ctx, info.FullMethod)
		if err != nil {
			return nil, err
		}
		return handler(ctx, req)
	}
}

// Stream is the grpc.StreamServerInterceptor of the authorizer.
func (a *Authorizer) Stream() grpc.StreamServerInterceptor {
	return func(srv any, ss grpc.ServerStream, info *grpc.StreamServerInfo, handler grpc.StreamHandler) (err error) {
		defer a.recovered(info.FullMethod, &err)
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
// with every call checked by an Authorizer trusting creds.Trust (the CA
// and the CRL the node holds) and the cluster's keepalives
// (ServerKeepalive). extra options are appended.
func NewServer(creds *identity.Credentials, log *slog.Logger, extra ...grpc.ServerOption) *grpc.Server {
	if creds == nil {
		panic(errors.New("rpc: NewServer needs credentials"))
	}
	trust := creds.Trust
	if trust == nil {
		trust = identity.NewTrust(creds.CA)
	}
	a := NewAuthorizer(trust, log, nil)
	opts := append([]grpc.ServerOption{grpc.Creds(credentials.NewTLS(creds.ServerTLSConfig()))}, a.ServerOptions()...)
	return grpc.NewServer(append(append(opts, ServerKeepalive()...), extra...)...)
}
