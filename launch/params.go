package launch

import (
	"crypto/ed25519"
	"crypto/rand"
	"os"

	"plinth.dev/plinth/api/nodepb"
	"plinth.dev/plinth/roleserver/parameters"
)

// ParametersFwCfg is the fw_cfg name nodes read their parameters from.
const ParametersFwCfg = parameters.FwCfgName

// BootstrapParameters returns parameters for a node bootstrapping a new
// cluster with a fresh owner key: the production default
// (parameters.NewBootstrap) with two changes for the harness. The node
// may seal new keys on an unmeasured boot (most tests boot with QEMU's
// -kernel, which firmware does not measure; a disk boot through OVMF
// clears this), and it runs no Kubernetes (most tests are about something
// else, and Kubernetes under TCG costs a minute of CPU): WithKubernetes
// gives it back.
func BootstrapParameters() *nodepb.Parameters {
	pub, _, err := ed25519.GenerateKey(rand.Reader)
	if err != nil {
		panic(err)
	}
	p := parameters.NewBootstrap(pub)
	b := p.GetBootstrap()
	b.NoKubernetesController, b.NoKubernetesWorker = true, true
	p.Tpm.AllowUnmeasuredBoot = true
	return p
}

// WithKubernetes makes bootstrap parameters start the first node as a
// Kubernetes controller and worker (a one-node cluster that runs pods),
// as a node's default parameters do.
func WithKubernetes(p *nodepb.Parameters) *nodepb.Parameters {
	if b := p.GetBootstrap(); b != nil {
		b.NoKubernetesController, b.NoKubernetesWorker = false, false
	}
	return p
}

// WriteParameters encodes p into file and returns file.
func WriteParameters(file string, p *nodepb.Parameters) (string, error) {
	raw, err := parameters.Encode(p)
	if err != nil {
		return "", err
	}
	return file, os.WriteFile(file, raw, 0o644)
}

// WithParameters adds p to o as the node's fw_cfg parameters document.
func (o NodeOptions) WithParameters(file string) NodeOptions {
	fw := map[string]string{}
	for k, v := range o.FwCfg {
		fw[k] = v
	}
	fw[ParametersFwCfg] = file
	o.FwCfg = fw
	return o
}
