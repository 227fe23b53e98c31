// Command e2etools is a static multi-call program standing in for the
// Linux userland tools the upstream Kubernetes e2e conformance tests
// exec in their containers.
//
// Why: the conformance runs' container images are built offline, without
// a registry to pull the upstream test images from and without a Linux
// distribution to take curl, netcat, dig or getent from. The tests use
// few of those tools' options, so those are reimplemented here in Go,
// with the real tools' output formats and exit codes where the tests (or
// people reading their logs) look at them, and an image ships this one
// binary with links named after the tools. Options the tests do not use
// fail clearly ("curl: unsupported option -Z", exit 2) rather than being
// ignored.
//
// curl, nc, dig and getent are package tools (tested by make unit);
// etcd and the sample API server, whole programs linked in from their
// modules, are this command's own, so those tests need not compile them.
// They are built in with tag servers only, as a second program,
// e2eservers (~90 MB; e2etools without them is ~7 MB): the images most
// specs pull carry e2etools, and only the etcd and sample API server
// images carry e2eservers (image/conformance.go).
//
// The tool is the name the binary runs as (a link named curl), or the
// first argument when it runs as e2etools (e2etools curl -s URL).
//
// Which tests use what (paths under k8s.io/kubernetes/test/e2e):
//
//   - curl: network/service.go, network/util.go, network/pod_lifecycle.go,
//     framework/network/utils.go: -g -q -s --connect-timeout N --max-time N,
//     -o /dev/null -w %{http_code}, -i; network/hostport.go: --interface IP
//     and http://[v6]:port URLs; network/kube_proxy.go and
//     framework/metrics: --silent HOST:PORT/path (no scheme);
//     auth/node_authn.go, node/kubelet_authz.go: -XGET -sIk --header;
//     apimachinery/aggregator.go (comments) and framework/kubesystem: -k -v.
//     Also -S, -f, -X, -H, -d, -m. No redirects are followed (curl's
//     default) and no proxy is used.
//   - nc: framework/service/jig.go, network/util.go: echo hostName | nc -v
//     -t|-u -w 2 HOST PORT; framework/network/utils.go and
//     network/hostport.go: echo hostname | nc -u -w N HOST PORT (the UDP
//     reply on stdout, nothing on stderr); network/networking.go: nc -vz -w
//     N HOST PORT; storage/host_path_type.go: nc -lU PATH. Also -l [-p]
//     PORT, -k, -q N, -n, -d, -s ADDR, -p PORT as the source port.
//   - dig: network/dns_common.go, network/dns.go: dig +notcp|+tcp +noall
//     +answer +search NAME [A|AAAA|PTR|SRV], dig +short [+search] NAME
//     [TYPE], dig +short @SERVER [-p PORT] NAME, dig +short -x ADDR. Servers,
//     search list and ndots come from /etc/resolv.conf.
//   - getent: network/dns_common.go: getent hosts NAME (the pod's
//     /etc/hosts entries). Also ahosts, and passwd and group [NAME|ID]
//     from the image's files, which no upstream test execs today.
//   - etcd and sample-apiserver: apimachinery/aggregator.go's deployment
//     of the sample API server (etcd --listen-client-urls URL
//     --advertise-client-urls URL, and the wardle server's flags), the
//     programs themselves linked in from their modules.
//
// Build (e2eservers: cgo stays on, with the Kubernetes build's tags, so
// the Go build cache's Kubernetes packages are reused; the static link is
// the kube binary's):
//
//	CGO_ENABLED=0 go build -trimpath -ldflags '-s -w' -o e2etools ./conformance/toolbox
//	go build -trimpath -tags servers,selinux,notest,grpcnotrace \
//	    -ldflags '-s -w -linkmode external -extldflags -static' \
//	    -o e2eservers ./conformance/toolbox
//
// Host names are resolved by Go's own resolver (netdns=go), which reads
// /etc/hosts, /etc/nsswitch.conf and /etc/resolv.conf like glibc and so
// needs no C library in the image.
package main
