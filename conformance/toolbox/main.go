//go:debug netdns=go

package main

import (
	"os"

	"plinth.dev/plinth/conformance/toolbox/tools"
)

func main() {
	os.Exit(tools.Main(os.Args, map[string]tools.Func{
		"etcd":             etcdMain,
		"sample-apiserver": sampleAPIServerMain,
	}, os.Stdin, os.Stdout, os.Stderr))
}
