//go:build servers

package main

import (
	"io"
	"os"

	genericapiserver "k8s.io/apiserver/pkg/server"
	"k8s.io/component-base/cli"
	"k8s.io/sample-apiserver/pkg/cmd/server"
)

func init() { servers["sample-apiserver"] = sampleAPIServerMain }

// sampleAPIServerMain is k8s.io/sample-apiserver's main.go (the wardle
// server the aggregator conformance test deploys), with its arguments
// set explicitly: cobra would otherwise take os.Args[1:], which with
// "e2etools sample-apiserver ..." starts with the tool's name.
func sampleAPIServerMain(args []string, _ io.Reader, stdout, stderr io.Writer) int {
	os.Args = append([]string{"sample-apiserver"}, args[1:]...)
	ctx := genericapiserver.SetupSignalContext()
	options := server.NewWardleServerOptions(stdout, stderr)
	cmd := server.NewCommandStartWardleServer(ctx, options, false)
	cmd.SetArgs(args[1:])
	return cli.Run(cmd)
}
