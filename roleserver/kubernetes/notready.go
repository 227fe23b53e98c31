package kubernetes

import (
	"bytes"
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"time"
)

// NotReadyReason is the reason of the Ready=False condition a node's
// Node gets when its KubernetesWorker role is removed (ReportStopped).
const NotReadyReason = "KubernetesWorkerRoleRemoved"

// ReportStopped tells the cluster at once that this worker's kubelet is
// gone: it sets the Node's Ready condition to False with NotReadyReason,
// as the kubelet whose credentials it uses (a node may update its own
// Node's status), through the first of servers (host:port of the
// controllers' API servers) that answers.
//
// Why: without it the Node stays Ready until the node lifecycle
// controller misses the kubelet's lease for its grace period (50 s), and
// the scheduler keeps placing pods on a node that will never run them.
// A kubelet that starts again reports Ready itself. It does nothing if
// the worker never got its certificates this boot.
func (w *Worker) ReportStopped(ctx context.Context, servers []string) error {
	cred := w.running.Load()
	if cred == nil {
		return nil
	}
	if len(servers) == 0 {
		return errors.New("no API server to report the stopped kubelet to")
	}
	pool := x509.NewCertPool()
	pool.AddCert(cred.certs.CA)
	client := &http.Client{Timeout: 10 * time.Second, Transport: &http.Transport{TLSClientConfig: &tls.Config{
		RootCAs: pool, MinVersion: tls.VersionTLS12,
		Certificates: []tls.Certificate{{Certificate: [][]byte{cred.certs.KubeletClient.Raw}, PrivateKey: cred.keys.kubeletClient}},
	}}}
	defer client.CloseIdleConnections()
	body, err := notReadyPatch(time.Now())
	if err != nil {
		return err
	}
	var errs []error
	for _, s := range servers {
		err := patchNodeStatus(ctx, client, "https://"+s, w.NodeID, body)
		if err == nil {
			return nil
		}
		errs = append(errs, fmt.Errorf("%s: %w", s, err))
	}
	return errors.Join(errs...)
}

// notReadyPatch is the strategic merge patch of a Node's status that
// sets its Ready condition (conditions merge by type) to False.
func notReadyPatch(now time.Time) ([]byte, error) {
	ts := now.UTC().Format(time.RFC3339)
	return json.Marshal(map[string]any{"status": map[string]any{"conditions": []any{map[string]any{
		"type": "Ready", "status": "False", "reason": NotReadyReason,
		"message":           "Plinth stopped the kubelet: the node's KubernetesWorker role was removed",
		"lastHeartbeatTime": ts, "lastTransitionTime": ts,
	}}}})
}

func patchNodeStatus(ctx context.Context, client *http.Client, server, node string, patch []byte) error {
	req, err := http.NewRequestWithContext(ctx, http.MethodPatch, server+"/api/v1/nodes/"+url.PathEscape(node)+"/status", bytes.NewReader(patch))
	if err != nil {
		return err
	}
	req.Header.Set("Content-Type", "application/strategic-merge-patch+json")
	req.Header.Set("Accept", "application/json")
	resp, err := client.Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		b, _ := io.ReadAll(io.LimitReader(resp.Body, 512))
		return fmt.Errorf("%s: %s", resp.Status, bytes.TrimSpace(b))
	}
	return nil
}
