package owner

import (
	"context"
	"fmt"
	"net/http"
	"net/url"
	"time"

	"plinth.dev/plinth/api/clusterpb"
)

// RotateSecretsKey takes one step of the rotation of the Secrets
// encryption key (STEP_STATUS: none) and returns where the cluster is.
func (c *Client) RotateSecretsKey(ctx context.Context, step clusterpb.RotateSecretsKeyRequest_Step) (*clusterpb.RotateSecretsKeyResponse, error) {
	var out *clusterpb.RotateSecretsKeyResponse
	err := c.management(ctx, func(m clusterpb.ManagementClient) (err error) {
		out, err = m.RotateSecretsKey(ctx, &clusterpb.RotateSecretsKeyRequest{Step: step})
		return err
	})
	return out, err
}

// RewriteSecrets writes every Secret of the cluster back as it is: the
// API server encrypts each with its current write key (it stores one read
// with an older key anew). It returns how many it wrote.
func (k *KubeAPI) RewriteSecrets(ctx context.Context) (int, error) {
	var list struct {
		Items []struct {
			Metadata struct {
				Name      string `json:"name"`
				Namespace string `json:"namespace"`
			} `json:"metadata"`
		} `json:"items"`
	}
	if _, err := k.do(ctx, http.MethodGet, "/api/v1/secrets", "", nil, &list); err != nil {
		return 0, err
	}
	n := 0
	for _, s := range list.Items {
		path := "/api/v1/namespaces/" + url.PathEscape(s.Metadata.Namespace) + "/secrets/" + url.PathEscape(s.Metadata.Name)
		for {
			var secret map[string]any
			status, err := k.do(ctx, http.MethodGet, path, "", nil, &secret)
			if status == http.StatusNotFound {
				break // deleted meanwhile: nothing to rewrite
			}
			if err != nil {
				return n, err
			}
			status, err = k.do(ctx, http.MethodPut, path, "application/json", secret, nil)
			if status == http.StatusConflict {
				// Changed meanwhile (and so written with the new key,
				// but read it again to be sure).
				select {
				case <-ctx.Done():
					return n, ctx.Err()
				case <-time.After(100 * time.Millisecond):
				}
				continue
			}
			if err != nil {
				return n, fmt.Errorf("rewriting Secret %s/%s: %w", s.Metadata.Namespace, s.Metadata.Name, err)
			}
			n++
			break
		}
	}
	return n, nil
}
