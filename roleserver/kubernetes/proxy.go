package kubernetes

import (
	"plinth.dev/plinth/platform/layout"
)

// proxyConfig is kube-proxy's KubeProxyConfiguration (nftables mode; the
// nft program and the nf_tables modules come with the system image).
// conntrack sysctls are left alone (maxPerCore 0): the node sets its own.
func proxyConfig(kubeconfigFile, nodeID string) []byte {
	return mustJSON(map[string]any{
		"apiVersion":         "kubeproxy.config.k8s.io/v1alpha1",
		"kind":               "KubeProxyConfiguration",
		"mode":               "nftables",
		"clientConnection":   map[string]any{"kubeconfig": kubeconfigFile},
		"clusterCIDR":        layout.ClusterCIDR,
		"hostnameOverride":   nodeID,
		"metricsBindAddress": "127.0.0.1:10249",
		"healthzBindAddress": "127.0.0.1:10256",
		"conntrack":          map[string]any{"maxPerCore": 0, "min": 0},
		"nodePortAddresses":  []string{"primary"},
		"logging":            map[string]any{"format": "text"},
	})
}

// corefile is the node's DNS server configuration: cluster names from
// the Kubernetes API, everything else forwarded to the node's own
// resolvers, on the link-local address pods get as their nameserver.
func corefile(kubeconfigFile, resolvConf string) []byte {
	return []byte(`.:53 {
    bind ` + layout.ClusterDNSIP + `
    errors
    kubernetes ` + layout.ClusterDomain + ` in-addr.arpa ip6.arpa {
        kubeconfig ` + kubeconfigFile + `
        pods insecure
        fallthrough in-addr.arpa ip6.arpa
        ttl 30
    }
    forward . ` + resolvConf + `
    cache 30
}
`)
}
