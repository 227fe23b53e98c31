// Package escrow is the client side (and the shared proof format) of
// AAA.Escrow, kept apart from the curator so that plinthctl does not link
// the curator's etcd dependencies.
//
//	client (ephemeral cert for the owner key)        curator
//	Parameters{requested_identity_name, public_key} ──►  key == owner key == TLS key?
//	                                                ◄──  NeededProofs{nonce: 32 random bytes}
//	Proof{signature}                                ──►  verify
//	                                                ◄──  Fulfilled{owner_certificate}
//
// The signature is ed25519 by the owner key over
//
//	nonce || TLS exporter value (RFC 5705, label identity.ExporterEscrow,
//	         no context, 32 bytes)
//
// The nonce makes it fresh; the exporter value binds it to this TLS
// session, so a relaying proxy cannot use it on its own connection.
package escrow

import (
	"context"
	"crypto/ed25519"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"io"

	"plinth.dev/plinth/api/clusterpb"
	"plinth.dev/plinth/roleserver/identity"
)

// IdentityOwner is the only requested_identity_name there is.
const IdentityOwner = "owner"

// EscrowProof signs the server's nonce for the TLS session state.
func EscrowProof(key ed25519.PrivateKey, nonce []byte, state tls.ConnectionState) ([]byte, error) {
	return identity.SessionProof(key, state, identity.ExporterEscrow, nonce)
}

// VerifyEscrowProof checks an EscrowProof from the other end of the same
// TLS session.
func VerifyEscrowProof(pub ed25519.PublicKey, nonce []byte, state tls.ConnectionState, sig []byte) error {
	if err := identity.VerifySessionProof(pub, state, identity.ExporterEscrow, nonce, sig); err != nil {
		return fmt.Errorf("escrow: signature is not by the owner key over this nonce and session: %w", err)
	}
	return nil
}

// TakeOwnership runs the client side of Escrow on aaa, whose connection
// must use creds (an ephemeral certificate for key), and returns the owner
// certificate.
func TakeOwnership(ctx context.Context, aaa clusterpb.AAAClient, creds *identity.CapturingCredentials, key ed25519.PrivateKey) (*x509.Certificate, error) {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	st, err := aaa.Escrow(ctx)
	if err != nil {
		return nil, err
	}
	if err := st.Send(&clusterpb.EscrowFromClient{Message: &clusterpb.EscrowFromClient_Parameters_{
		Parameters: &clusterpb.EscrowFromClient_Parameters{
			RequestedIdentityName: IdentityOwner,
			PublicKey:             key.Public().(ed25519.PublicKey),
		},
	}}); err != nil {
		if errors.Is(err, io.EOF) {
			// The server ended the stream (e.g. refused the caller at
			// once): the reason is the stream's status, which Recv returns.
			if _, rerr := st.Recv(); rerr != nil {
				return nil, rerr
			}
		}
		return nil, fmt.Errorf("escrow: sending parameters: %w", err)
	}
	msg, err := st.Recv()
	if err != nil {
		return nil, err
	}
	needed := msg.GetNeededProofs()
	if needed == nil {
		return nil, errors.New("escrow: server did not ask for a proof")
	}
	state, ok := creds.State()
	if !ok {
		return nil, errors.New("escrow: no TLS state captured for this connection")
	}
	sig, err := EscrowProof(key, needed.Nonce, state)
	if err != nil {
		return nil, err
	}
	if err := st.Send(&clusterpb.EscrowFromClient{Message: &clusterpb.EscrowFromClient_Proof_{
		Proof: &clusterpb.EscrowFromClient_Proof{Signature: sig},
	}}); err != nil && !errors.Is(err, io.EOF) {
		// io.EOF: the server ended the stream; Recv below has its status.
		return nil, fmt.Errorf("escrow: sending proof: %w", err)
	}
	if msg, err = st.Recv(); err != nil {
		return nil, err
	}
	f := msg.GetFulfilled()
	if f == nil {
		return nil, errors.New("escrow: server did not fulfil the request")
	}
	cert, err := x509.ParseCertificate(f.OwnerCertificate)
	if err != nil {
		return nil, fmt.Errorf("escrow: owner certificate: %w", err)
	}
	if pub, ok := cert.PublicKey.(ed25519.PublicKey); !ok || !pub.Equal(key.Public()) {
		return nil, errors.New("escrow: owner certificate is not for this key")
	}
	st.CloseSend()
	return cert, nil
}
