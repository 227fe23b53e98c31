package main

import (
	"flag"
	"fmt"
	"os"

	"github.com/coredns/caddy"
	"github.com/coredns/coredns/core/dnsserver"
	// The plugins the node's DNS server uses, and nothing else: each one
	// registers itself; Directives below fixes their order in a query's
	// path.
	_ "github.com/coredns/coredns/plugin/bind"
	_ "github.com/coredns/coredns/plugin/cache"
	_ "github.com/coredns/coredns/plugin/errors"
	_ "github.com/coredns/coredns/plugin/forward"
	_ "github.com/coredns/coredns/plugin/kubernetes"
)

// runDNS is `kube dns -conf FILE`: the node's cluster DNS server, CoreDNS
// built from its Go packages with the plugins above. coremain (CoreDNS's
// own main) is not used: it registers command-line flags globally, which
// would collide with the Kubernetes components' flags in this binary.
func runDNS(args []string) int {
	fs := flag.NewFlagSet("dns", flag.ContinueOnError)
	conf := fs.String("conf", "", "Corefile")
	if err := fs.Parse(args); err != nil || *conf == "" {
		fmt.Fprintln(os.Stderr, "usage: kube dns -conf COREFILE")
		return 2
	}
	contents, err := os.ReadFile(*conf)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	dnsserver.Directives = []string{"bind", "errors", "cache", "kubernetes", "forward"}
	if err := dnsserver.Register(); err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	caddy.Quiet = true
	instance, err := caddy.Start(caddy.CaddyfileInput{Contents: contents, Filepath: *conf, ServerTypeName: "dns"})
	if err != nil {
		fmt.Fprintln(os.Stderr, "dns:", err)
		return 1
	}
	fmt.Println("dns: serving")
	instance.Wait()
	return 0
}
