// Command kube is the multi-call Kubernetes binary of a Plinth node: one
// executable in the system image for every Kubernetes component the Role
// Server runs, each as its own child process.
//
//	kube apiserver          ARGS   kube-apiserver
//	kube controller-manager ARGS   kube-controller-manager
//	kube scheduler          ARGS   kube-scheduler
//	kube kubelet            ARGS   kubelet
//	kube proxy              ARGS   kube-proxy
//	kube metrics-server     ARGS   metrics-server (the metrics.k8s.io API)
//	kube dns -conf FILE            the node's cluster DNS server (CoreDNS packages)
//	kube netd …                    the node's pod network (CNI configuration, routes)
//	kube import-images …           the builder's OCI images into containerd
//	kube credential-provider -file F  the kubelet's image credential provider
//	kube local-volumes …           the node's local volume provisioner
//	kube network-policies …        NetworkPolicy for the node's pods (nftables)
//
// Why one binary: the components share most of their code (client-go,
// apimachinery, the API types), so one executable is a fraction of the
// size of five. Each component is built only when it is called, because
// Kubernetes does global set-up (flags, feature gates, metrics
// registries) inside its New…Command functions, and two components'
// set-up must never meet in one process.
package main

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strings"

	"github.com/spf13/cobra"
	genericapiserver "k8s.io/apiserver/pkg/server"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/clientcmd"
	"k8s.io/component-base/cli"
	apiserver "k8s.io/kubernetes/cmd/kube-apiserver/app"
	controllermanager "k8s.io/kubernetes/cmd/kube-controller-manager/app"
	proxy "k8s.io/kubernetes/cmd/kube-proxy/app"
	scheduler "k8s.io/kubernetes/cmd/kube-scheduler/app"
	kubelet "k8s.io/kubernetes/cmd/kubelet/app"
	metricsserver "sigs.k8s.io/metrics-server/cmd/metrics-server/app"
)

// components maps a name to its command, made only when called.
var components = map[string]func() *cobra.Command{
	"apiserver":          func() *cobra.Command { return apiserver.NewAPIServerCommand() },
	"controller-manager": func() *cobra.Command { return controllermanager.NewControllerManagerCommand() },
	"scheduler":          func() *cobra.Command { return scheduler.NewSchedulerCommand() },
	"kubelet":            func() *cobra.Command { return kubelet.NewKubeletCommand(context.Background()) },
	"proxy":              func() *cobra.Command { return proxy.NewProxyCommand() },
	"metrics-server": func() *cobra.Command {
		return metricsserver.NewMetricsServerCommand(genericapiserver.SetupSignalHandler())
	},
}

// tools are Plinth's own node programs in this binary.
var tools = map[string]func(args []string) int{
	"dns":           runDNS,
	"netd":          runNetd,
	"import-images": runImportImages,
	// credential-provider answers the kubelet's image credential
	// requests (also run as kube-credential-provider).
	"credential-provider": runCredentialProvider,
	"local-volumes":       runLocalVolumes,
	"network-policies":    runNetworkPolicies,
}

func main() {
	name, args := filepath.Base(os.Args[0]), os.Args[1:]
	name = strings.TrimPrefix(name, "kube-")
	if _, ok := components[name]; !ok && tools[name] == nil && len(args) > 0 {
		name, args = strings.TrimPrefix(args[0], "kube-"), args[1:]
	}
	if tool := tools[name]; tool != nil {
		os.Exit(tool(args))
	}
	newCmd, ok := components[name]
	if !ok {
		var names []string
		for n := range components {
			names = append(names, n)
		}
		for n := range tools {
			names = append(names, n)
		}
		sort.Strings(names)
		fmt.Fprintf(os.Stderr, "usage: kube COMPONENT [flags]\ncomponents: %s\n", strings.Join(names, ", "))
		os.Exit(2)
	}
	cmd := newCmd()
	cmd.SetArgs(args)
	os.Exit(cli.Run(cmd))
}

// clientset is a client of the API server a kubeconfig file names, with
// its credentials: the node programs' (netd, local-volumes,
// network-policies).
func clientset(kubeconfig string) (*kubernetes.Clientset, error) {
	cfg, err := clientcmd.BuildConfigFromFlags("", kubeconfig)
	if err != nil {
		return nil, err
	}
	return kubernetes.NewForConfig(cfg)
}
