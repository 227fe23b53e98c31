package kubernetes

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"slices"
	"strings"
	"time"

	"plinth.dev/plinth/platform/layout"
	"plinth.dev/plinth/platform/supervisor"
	"plinth.dev/plinth/roleserver/kubernetes/pki"
)

// A decommissioned node never comes back, and neither do the local
// volumes on its disk: every controller deletes the PersistentVolumes
// its provisioner made (and their protection finalizer, which would
// keep a bound one until its claim goes), so their claims go Lost and
// their owners see it, instead of pods waiting forever for a node that
// is gone; and its Node, so that its pods are collected and the nodes
// Kubernetes lists are the cluster's. Guarded by TestControlPlaneOnHost
// (checkLocalVolumes, checkDecommissionedIdentities).
//
//	curator store: node DECOMMISSIONED ──► (every decommissionPoll) ──► PVs provisioned by
//	                                         layout.LocalVolumesProvisioner, node affinity
//	                                         to that node: DELETE, finalizers cleared;
//	                                         its metrics endpoint (metrics.go): DELETE;
//	                                         its Node: DELETE (its pods then go too)

// decommissionPoll is how often the controllers look for decommissioned
// nodes' volumes.
const decommissionPoll = time.Minute

// decommissionedVolumes is the runnable deleting decommissioned nodes'
// local volumes through server, every interval; decommissioned lists
// the nodes (the curator's store).
func decommissionedVolumes(p *pki.PKI, nodeID, server string, decommissioned func(context.Context) ([]string, error), interval time.Duration) supervisor.Runnable {
	return func(ctx context.Context) error {
		supervisor.Signal(ctx, supervisor.SignalHealthy)
		for {
			if err := deleteDecommissionedVolumes(ctx, p, nodeID, server, decommissioned); err != nil {
				supervisor.Logger(ctx).Warn("deleting the local volumes of decommissioned nodes (tried again later)", "err", err)
			}
			select {
			case <-ctx.Done():
				return ctx.Err()
			case <-time.After(interval):
			}
		}
	}
}

// localVolume is what deleteDecommissionedVolumes reads of a
// PersistentVolume.
type localVolume struct {
	Metadata struct {
		Name        string            `json:"name"`
		UID         string            `json:"uid"`
		Annotations map[string]string `json:"annotations"`
		Finalizers  []string          `json:"finalizers"`
	} `json:"metadata"`
	Spec struct {
		NodeAffinity struct {
			Required struct {
				NodeSelectorTerms []struct {
					MatchExpressions []struct {
						Key      string   `json:"key"`
						Operator string   `json:"operator"`
						Values   []string `json:"values"`
					} `json:"matchExpressions"`
				} `json:"nodeSelectorTerms"`
			} `json:"required"`
		} `json:"nodeAffinity"`
	} `json:"spec"`
}

// node is the one node v is bound to, as the provisioner binds its
// volumes ("" if not so).
func (v *localVolume) node() string {
	terms := v.Spec.NodeAffinity.Required.NodeSelectorTerms
	if len(terms) != 1 || len(terms[0].MatchExpressions) != 1 {
		return ""
	}
	e := terms[0].MatchExpressions[0]
	if e.Key != "kubernetes.io/hostname" || e.Operator != "In" || len(e.Values) != 1 {
		return ""
	}
	return e.Values[0]
}

func deleteDecommissionedVolumes(ctx context.Context, p *pki.PKI, nodeID, server string, decommissioned func(context.Context) ([]string, error)) error {
	gone, err := decommissioned(ctx)
	if err != nil || len(gone) == 0 {
		return err
	}
	client, err := adminClient(ctx, p, nodeID)
	if err != nil {
		return err
	}
	defer client.CloseIdleConnections()
	do := func(method, path, contentType, body string) ([]byte, error) {
		return apiDo(ctx, client, method, server+path, contentType, body)
	}
	b, err := do(http.MethodGet, "/api/v1/persistentvolumes", "", "")
	if err != nil {
		return err
	}
	var list struct {
		Items []localVolume `json:"items"`
	}
	if err := json.Unmarshal(b, &list); err != nil {
		return fmt.Errorf("PersistentVolumes: %w", err)
	}
	for _, v := range list.Items {
		node := v.node()
		if v.Metadata.Annotations["pv.kubernetes.io/provisioned-by"] != layout.LocalVolumesProvisioner || !slices.Contains(gone, node) {
			continue
		}
		path := "/api/v1/persistentvolumes/" + url.PathEscape(v.Metadata.Name)
		if _, err := do(http.MethodDelete, path, "application/json", `{"preconditions":{"uid":"`+v.Metadata.UID+`"}}`); err != nil {
			return err
		}
		if len(v.Metadata.Finalizers) > 0 {
			if _, err := do(http.MethodPatch, path, "application/merge-patch+json", `{"metadata":{"finalizers":null}}`); err != nil {
				return err
			}
		}
		supervisor.Logger(ctx).Info("deleted a local volume of a decommissioned node", "volume", v.Metadata.Name, "node", node)
	}
	// A decommissioned controller's metrics endpoint (metrics.go), left
	// ready if it was never stopped cleanly.
	if b, err = do(http.MethodGet, "/apis/discovery.k8s.io/v1/namespaces/kube-system/endpointslices?labelSelector="+
		url.QueryEscape("endpointslice.kubernetes.io/managed-by="+metricsSliceManager), "", ""); err != nil {
		return err
	}
	var eps objectList
	if err := json.Unmarshal(b, &eps); err != nil {
		return fmt.Errorf("EndpointSlices: %w", err)
	}
	for _, sl := range eps.Items {
		for _, node := range gone {
			if sl.Metadata.Name == metricsSliceName(node) {
				if _, err := do(http.MethodDelete, metricsSlicePath(node), "", ""); err != nil {
					return err
				}
				supervisor.Logger(ctx).Info("deleted the metrics endpoint of a decommissioned controller", "node", node)
			}
		}
	}
	// Its Node: the pods bound to it are then garbage collected, and
	// kubectl get nodes lists the nodes there are.
	if b, err = do(http.MethodGet, "/api/v1/nodes", "", ""); err != nil {
		return err
	}
	var nodes objectList
	if err := json.Unmarshal(b, &nodes); err != nil {
		return fmt.Errorf("the Nodes: %w", err)
	}
	for _, n := range nodes.Items {
		if !slices.Contains(gone, n.Metadata.Name) {
			continue
		}
		if _, err := do(http.MethodDelete, "/api/v1/nodes/"+url.PathEscape(n.Metadata.Name), "application/json", `{"preconditions":{"uid":"`+n.Metadata.UID+`"}}`); err != nil {
			return err
		}
		supervisor.Logger(ctx).Info("deleted the Node of a decommissioned node", "node", n.Metadata.Name)
	}
	return nil
}

// objectList is what deleteDecommissionedVolumes reads of a list of
// objects: their names and UIDs.
type objectList struct {
	Items []struct {
		Metadata struct {
			Name string `json:"name"`
			UID  string `json:"uid"`
		} `json:"metadata"`
	} `json:"items"`
}

// apiDo sends a request (body of contentType, if any) to url with
// client: the answer's body, an error for any answer but a 2xx or a 404
// (the object is gone, as a delete wants it).
func apiDo(ctx context.Context, client *http.Client, method, url, contentType, body string) ([]byte, error) {
	req, err := http.NewRequestWithContext(ctx, method, url, strings.NewReader(body))
	if err != nil {
		return nil, err
	}
	if contentType != "" {
		req.Header.Set("Content-Type", contentType)
	}
	resp, err := client.Do(req)
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(io.LimitReader(resp.Body, 64<<20))
	if err != nil {
		return nil, err
	}
	if resp.StatusCode/100 != 2 && resp.StatusCode != http.StatusNotFound {
		return nil, fmt.Errorf("%s %s: %s: %.300s", method, url, resp.Status, b)
	}
	return b, nil
}
