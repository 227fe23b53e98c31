//go:debug netdns=go

package main

import (
	"os"

	"plinth.dev/plinth/conformance/toolbox/tools"
)

// servers are the whole programs of the build with tag servers
// (e2eservers: etcd.go, sampleapiserver.go), none without it (e2etools).
var servers = map[string]tools.Func{}

func main() {
	os.Exit(tools.Main(os.Args, servers, os.Stdin, os.Stdout, os.Stderr))
}
