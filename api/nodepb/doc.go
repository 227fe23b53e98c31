// Package nodepb holds the Go code generated from api/node/v1/parameters.proto:
// the node parameters document that tells a Plinth node on first boot whether
// to bootstrap or join a cluster and how to set up its storage, TPM and
// network.
//
// Do not edit the .pb.go files; change the .proto and run `make generate`.
// Reading, validating and defaulting the document is the job of
// plinth.dev/plinth/roleserver/parameters, not of this package.
package nodepb
