package parameters

import (
	"crypto/ed25519"

	"plinth.dev/plinth/api/nodepb"
)

// NewBootstrap returns the document that founds a new cluster owned by
// owner with a node's defaults spelled out: the node is a consensus
// member, Kubernetes controller and Kubernetes worker (a one-node cluster
// that runs pods), seals its keys in a required TPM and keeps its data on
// an encrypted ext4 partition; the cluster's initial policy requires a
// TPM of every node. `plinthctl params --bootstrap` and the first run of
// `plinthctl run` start from it, so the first command a user types gets
// the node the README describes; tests that want less (no Kubernetes)
// take it away from this, never the other way round.
func NewBootstrap(owner ed25519.PublicKey) *nodepb.Parameters {
	return &nodepb.Parameters{
		Cluster: &nodepb.Parameters_Bootstrap{Bootstrap: &nodepb.Bootstrap{
			OwnerPublicKey: owner,
			InitialPolicy:  &nodepb.ClusterPolicy{},
		}},
		Tpm:     &nodepb.NodeTPM{Policy: nodepb.NodeTPM_TPM_POLICY_REQUIRED},
		Storage: &nodepb.NodeStorage{Security: nodepb.StorageSecurity_STORAGE_SECURITY_ENCRYPTED, Filesystem: nodepb.NodeStorage_FILESYSTEM_EXT4},
	}
}

// RunsKubernetes reports which Kubernetes roles a bootstrap document
// gives its node (a register document gives none: the cluster's owner
// does).
func RunsKubernetes(p *nodepb.Parameters) (controller, worker bool) {
	b := p.GetBootstrap()
	if b == nil {
		return false, false
	}
	return !b.GetNoKubernetesController(), !b.GetNoKubernetesWorker()
}
