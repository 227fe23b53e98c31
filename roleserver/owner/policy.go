package owner

import (
	"context"

	"plinth.dev/plinth/api/clusterpb"
)

// UpdatePolicy changes the cluster policy (see
// UpdateClusterPolicyRequest) and returns it as it is now.
func (c *Client) UpdatePolicy(ctx context.Context, req *clusterpb.UpdateClusterPolicyRequest) (*clusterpb.ClusterConfiguration, error) {
	var out *clusterpb.ClusterConfiguration
	err := c.management(ctx, func(m clusterpb.ManagementClient) error {
		r, err := m.UpdateClusterPolicy(ctx, req)
		out = r.GetConfiguration()
		return err
	})
	return out, err
}

// RevokeKubernetesCredentials ends every Kubernetes certificate the
// owner was issued so far and returns the new epoch. Retried on another
// curator after UNAVAILABLE, it may move the epoch twice: either way no
// earlier certificate works.
func (c *Client) RevokeKubernetesCredentials(ctx context.Context) (uint64, error) {
	var epoch uint64
	err := c.management(ctx, func(m clusterpb.ManagementClient) error {
		r, err := m.RevokeKubernetesCredentials(ctx, &clusterpb.RevokeKubernetesCredentialsRequest{})
		epoch = r.GetEpoch()
		return err
	})
	return epoch, err
}
