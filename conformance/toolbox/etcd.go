//go:build servers

package main

import (
	"io"
	"os"

	"go.etcd.io/etcd/server/v3/etcdmain"
)

func init() { servers["etcd"] = etcdMain }

// etcdMain is etcd's own main, for the etcd container of the aggregator
// test's sample API server deployment (/usr/local/bin/etcd
// --listen-client-urls URL --advertise-client-urls URL). etcdmain.Main
// parses args[1:] but its gateway and grpc-proxy subcommands go through
// cobra, which reads os.Args: both get the tool's own argument list.
// It exits the process itself on errors; it returns when etcd stops.
func etcdMain(args []string, _ io.Reader, _, _ io.Writer) int {
	args = append([]string{"etcd"}, args[1:]...)
	os.Args = args
	etcdmain.Main(args)
	return 0
}
