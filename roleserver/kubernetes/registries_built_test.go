//go:build built

package kubernetes

import (
	"bytes"
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"testing"
)

// TestCredentialProvider: the kube binary's credential-provider tool,
// run as the kubelet runs it (the executable named
// kube-credential-provider, the request on stdin), answers the
// registry's credentials for its images and no credentials for others'.
// It needs the kube binary make builds (the built tag).
func TestCredentialProvider(t *testing.T) {
	cfg := credentialProviderTestConfig(t)
	kube := os.Getenv("PLINTH_KUBE")
	if kube == "" {
		t.Fatal("PLINTH_KUBE unset: run `make unit`, which builds out/bin/kube")
	}
	link := filepath.Join(t.TempDir(), credentialProviderName)
	if err := os.Symlink(kube, link); err != nil {
		t.Fatal(err)
	}
	ask := func(image string) map[string]any {
		t.Helper()
		cmd := exec.Command(link, cfg.Providers[0].Args...)
		cmd.Stdin = bytes.NewReader([]byte(`{"apiVersion":"credentialprovider.kubelet.k8s.io/v1","kind":"CredentialProviderRequest","image":"` + image + `"}`))
		var stderr bytes.Buffer
		cmd.Stderr = &stderr
		out, err := cmd.Output()
		if err != nil {
			t.Fatalf("%s: %v: %s", image, err, stderr.String())
		}
		var resp map[string]any
		if err := json.Unmarshal(out, &resp); err != nil {
			t.Fatalf("%s: response %q: %v", image, out, err)
		}
		if resp["kind"] != "CredentialProviderResponse" || resp["apiVersion"] != "credentialprovider.kubelet.k8s.io/v1" || resp["cacheKeyType"] != "Registry" {
			t.Errorf("%s: response %v", image, resp)
		}
		return resp
	}
	auth, _ := ask("10.0.0.5:5000/plinth/testpod@sha256:0123")["auth"].(map[string]any)
	if a, _ := auth["10.0.0.5:5000"].(map[string]any); len(auth) != 1 || a["username"] != "puller" || a["password"] != "s3cret" {
		t.Errorf("credentials for the registry's image: %v", auth)
	}
	if auth, _ := ask("registry.example.com/plinth/testpod:v1")["auth"].(map[string]any); len(auth) != 0 {
		t.Errorf("credentials for another registry's image: %v", auth)
	}
}
