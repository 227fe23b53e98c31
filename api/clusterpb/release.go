package clusterpb

import "plinth.dev/plinth/platform/releasekeys"

// Signed is the statement as platform/releasekeys verifies it.
func (s *SignedStatement) Signed() releasekeys.Signed {
	out := releasekeys.Signed{Body: s.GetBody()}
	for _, sig := range s.GetSignatures() {
		out.Signatures = append(out.Signatures, releasekeys.Signature{Key: sig.GetPublicKey(), Sig: sig.GetSignature()})
	}
	return out
}

// NewSignedStatement is s as the cluster's API carries it.
func NewSignedStatement(s releasekeys.Signed) *SignedStatement {
	out := &SignedStatement{Body: s.Body}
	for _, sig := range s.Signatures {
		out.Signatures = append(out.Signatures, &StatementSignature{PublicKey: sig.Key, Signature: sig.Sig})
	}
	return out
}

// ReleaseKeyChainSigned is the policy's chain of release key sets as
// platform/releasekeys verifies it.
func (c *ClusterConfiguration) ReleaseKeyChainSigned() []releasekeys.Signed {
	var out []releasekeys.Signed
	for _, s := range c.GetReleaseKeyChain() {
		out = append(out, s.Signed())
	}
	return out
}
