package main

import (
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"strconv"

	"plinth.dev/plinth/api/nodepb"
	"plinth.dev/plinth/roleserver/owner"
	"plinth.dev/plinth/roleserver/parameters"
)

// runGuide is what plinthctl run tells its user to type next, worked out
// from what it boots: the node's parameters (which roles it starts with),
// the owner configuration (taken ownership yet?) and the forwarded ports.
// Every command it prints is meant to be pasted as it is; the VM test
// TestRunFirstMinutes runs them as printed.
type runGuide struct {
	self, kubectl string // how to call plinthctl and the project's kubectl
	state         string
	ownerDir      string
	owner         *owner.Config // owner.LoadConfig(ownerDir)
	ownerErr      error
	params        *nodepb.Parameters // the node's document
	paramsFile    string
	curatorPort   int
	mgmtPort      int
	apiPort       int
	kvm           bool
}

// bootstrappedLine is what the bootstrap node's console says once its
// curator serves (roleserver's control plane worker logs it).
const bootstrappedLine = "cluster bootstrapped: node certificate issued"

// runKubeconfigWait is how long the printed kubeconfig command waits for
// the cluster to take pods: under TCG a new node's API server serves after
// one to two minutes, its controller manager makes the default service
// account a minute or more later, and on a loaded 2-core host (the VM
// tests beside it) the two took over five minutes.
const runKubeconfigWait = "10m"

func (g runGuide) write(w io.Writer) {
	switch {
	case errors.Is(g.ownerErr, os.ErrNotExist) || (g.ownerErr == nil && g.owner.Key == nil):
		fmt.Fprintf(w, "plinthctl: no owner key in %s (the node's parameters were not made by a first plinthctl run): take ownership with their key (%s cluster takeownership --owner-key FILE), or start afresh with an empty --state\n", g.ownerDir, g.self)
		return
	case g.ownerErr != nil:
		fmt.Fprintf(w, "plinthctl: %v\n", g.ownerErr)
		return
	case g.curatorPort == 0:
		return
	}
	config := " --config " + g.ownerDir
	if g.owner.Credentials == nil {
		mgmt := ""
		if g.mgmtPort != 0 {
			mgmt = " --mgmt-endpoint " + loopback(g.mgmtPort)
		}
		fmt.Fprintf(w, "plinthctl: once the console shows %q, in another shell:\n  %s cluster takeownership%s --endpoint %s%s\n",
			bootstrappedLine, g.self, config, loopback(g.curatorPort), mgmt)
	} else {
		fmt.Fprintf(w, "plinthctl: you own this node (%s); in another shell:\n", g.ownerDir)
	}
	fmt.Fprintf(w, "  %s node list%s\n  %s node logs%s NODE\n", g.self, config, g.self, config)

	controller, worker := parameters.RunsKubernetes(g.params)
	switch {
	case g.params.GetBootstrap() == nil:
		fmt.Fprintf(w, "plinthctl: the node registers with an existing cluster (%s), whose owner gives it its roles\n", g.paramsFile)
	case !controller || !worker:
		// Parameters without Kubernetes stay as they are (the node was
		// set up with them); its roles can change.
		fmt.Fprintf(w, "plinthctl: this node's parameters (%s, kept as they are: the node was set up with them) start it without the Kubernetes %s role; to run pods on it, as its owner:\n  %s role add%s NODE kubernetes-controller kubernetes-worker\n",
			g.paramsFile, map[bool]string{true: "worker", false: "controller"}[controller], g.self, config)
	case g.apiPort != 0:
		kubeconfig := g.state + "/kubeconfig"
		fmt.Fprintf(w, "  %s cluster kubeconfig%s --server https://%s --wait %s --file %s && %s --kubeconfig %s get nodes\n",
			g.self, config, loopback(g.apiPort), runKubeconfigWait, kubeconfig, g.kubectl, kubeconfig)
		if g.kvm {
			fmt.Fprintln(w, "plinthctl: the node runs Kubernetes (controller and worker); its API server serves within a minute of power-on (cluster kubeconfig --wait waits for it)")
		} else {
			fmt.Fprintln(w, "plinthctl: the node runs Kubernetes (controller and worker); under TCG its API server serves about 1-2 minutes after power-on and the node is Ready about half a minute later (cluster kubeconfig --wait waits for the API server)")
		}
	}
	fmt.Fprintln(w, "plinthctl: NODE is the node's ID, as plinthctl node list shows it")
}

// loopback is 127.0.0.1:port.
func loopback(port int) string { return net.JoinHostPort("127.0.0.1", strconv.Itoa(port)) }
