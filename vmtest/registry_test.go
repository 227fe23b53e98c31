//go:build built

package vmtest

import (
	"crypto/tls"
	"crypto/x509"
	"net/http"
	"testing"
)

// TestRegistry: the harness's registry serves a pushed image by tag and
// by digest over TLS from its CA, anonymously on one listener and only
// with its credentials (a Basic challenge otherwise) on the other.
func TestRegistry(t *testing.T) {
	reg, digest := startPullRegistry(t)
	pool := x509.NewCertPool()
	if !pool.AppendCertsFromPEM(reg.CAPEM) {
		t.Fatal("CA PEM")
	}
	client := &http.Client{Transport: &http.Transport{TLSClientConfig: &tls.Config{RootCAs: pool}}}
	get := func(addr, ref, user, pass string) *http.Response {
		t.Helper()
		req, _ := http.NewRequest(http.MethodGet, "https://"+addr+"/v2/"+pullRepo+"/manifests/"+ref, nil)
		req.Header.Set("Accept", "application/vnd.oci.image.manifest.v1+json, application/vnd.docker.distribution.manifest.v2+json")
		if user != "" {
			req.SetBasicAuth(user, pass)
		}
		resp, err := client.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		return resp
	}
	for _, tc := range []struct {
		addr, ref, user, pass string
		want                  int
	}{
		{reg.Anonymous, "v1", "", "", http.StatusOK},
		{reg.Anonymous, digest, "", "", http.StatusOK},
		{reg.Auth, "v1", "", "", http.StatusUnauthorized},
		{reg.Auth, "v1", reg.Username, "wrong", http.StatusUnauthorized},
		{reg.Auth, digest, reg.Username, reg.Password, http.StatusOK},
		{reg.Anonymous, "v2", "", "", http.StatusNotFound},
	} {
		resp := get(tc.addr, tc.ref, tc.user, tc.pass)
		if resp.StatusCode != tc.want {
			t.Errorf("%s %s (user %q): %s, want %d", tc.addr, tc.ref, tc.user, resp.Status, tc.want)
		}
		if tc.want == http.StatusOK && resp.Header.Get("Docker-Content-Digest") != digest {
			t.Errorf("%s %s: digest %q, want %s", tc.addr, tc.ref, resp.Header.Get("Docker-Content-Digest"), digest)
		}
		if tc.want == http.StatusUnauthorized && resp.Header.Get("WWW-Authenticate") == "" {
			t.Errorf("%s: 401 without a challenge", tc.addr)
		}
	}
}
