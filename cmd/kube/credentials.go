package main

import (
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"strings"
)

// The kubelet's image credential provider (credentialprovider.kubelet.k8s.io/v1):
//
//	kubelet ──exec──► registries/bin/kube-credential-provider -file credentials.json
//	         stdin:  CredentialProviderRequest  {"image": "10.0.0.5:5000/app@sha256:…"}
//	         stdout: CredentialProviderResponse {"auth": {"10.0.0.5:5000": {username, password}}}
//
// The node writes the credentials file (tmpfs, 0600) from the cluster
// policy's image registries and configures the kubelet to run this for
// exactly the registries that have credentials (see
// roleserver/kubernetes/registries.go); an image of another registry gets
// an empty answer, which the kubelet takes as "pull anonymously".

const credentialProviderAPI = "credentialprovider.kubelet.k8s.io/v1"

// credentialCacheDuration is how long the kubelet keeps an answer.
const credentialCacheDuration = "1m"

func runCredentialProvider(args []string) int {
	fs := flag.NewFlagSet("credential-provider", flag.ContinueOnError)
	file := fs.String("file", "", "the node's registry credentials (JSON: registry host → username, password)")
	if err := fs.Parse(args); err != nil {
		return 2
	}
	if err := credentialProvider(os.Stdin, os.Stdout, *file); err != nil {
		fmt.Fprintf(os.Stderr, "kube credential-provider: %v\n", err)
		return 1
	}
	return 0
}

type credential struct {
	Username string `json:"username"`
	Password string `json:"password"`
}

func credentialProvider(in io.Reader, out io.Writer, file string) error {
	if file == "" {
		return errors.New("-file is required")
	}
	var req struct {
		APIVersion string `json:"apiVersion"`
		Kind       string `json:"kind"`
		Image      string `json:"image"`
	}
	if err := json.NewDecoder(in).Decode(&req); err != nil {
		return fmt.Errorf("reading the request: %w", err)
	}
	if req.APIVersion != credentialProviderAPI || req.Kind != "CredentialProviderRequest" || req.Image == "" {
		return fmt.Errorf("a request of kind %q, API version %q, image %q: want a CredentialProviderRequest of %s for an image", req.Kind, req.APIVersion, req.Image, credentialProviderAPI)
	}
	raw, err := os.ReadFile(file)
	if err != nil {
		return err
	}
	creds := map[string]credential{}
	if err := json.Unmarshal(raw, &creds); err != nil {
		return fmt.Errorf("%s: %w", file, err)
	}
	auth := map[string]credential{}
	host := imageRegistry(req.Image)
	if c, ok := creds[host]; ok {
		auth[host] = c
	}
	return json.NewEncoder(out).Encode(map[string]any{
		"apiVersion":    credentialProviderAPI,
		"kind":          "CredentialProviderResponse",
		"cacheKeyType":  "Registry",
		"cacheDuration": credentialCacheDuration,
		"auth":          auth,
	})
}

// imageRegistry is the registry an image reference names: its first
// component if that looks like a host (a dot, a port or localhost), else
// Docker Hub.
func imageRegistry(image string) string {
	first, _, found := strings.Cut(image, "/")
	if found && (strings.ContainsAny(first, ".:") || first == "localhost") {
		return strings.ToLower(first)
	}
	return "docker.io"
}
