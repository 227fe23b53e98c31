package curator

import (
	"crypto/x509"
	"fmt"
	"strconv"
	"strings"

	"plinth.dev/plinth/api/clusterpb"
	"plinth.dev/plinth/platform/pki"
)

// parseFilter understands the subset of CEL that tools need for
// GetNodes.filter (there is no CEL library in the build): conditions
// joined by &&, each one of
//
//	node.state == NODE_STATE_NEW        (also !=; state, health, tpm_usage)
//	node.id == "plinth-0123456789abcdef" (also !=)
//	has(node.roles.consensus_member)    (also !has(...); kubernetes_controller,
//	                                     kubernetes_worker)
//
// Anything else is an error rather than a silently wrong answer.
func parseFilter(expr string) (func(*clusterpb.Node) bool, error) {
	var preds []func(*clusterpb.Node) bool
	if strings.TrimSpace(expr) == "" {
		return func(*clusterpb.Node) bool { return true }, nil
	}
	for _, c := range strings.Split(expr, "&&") {
		p, err := parseCondition(strings.TrimSpace(c))
		if err != nil {
			return nil, err
		}
		preds = append(preds, p)
	}
	return func(n *clusterpb.Node) bool {
		for _, p := range preds {
			if !p(n) {
				return false
			}
		}
		return true
	}, nil
}

func parseCondition(c string) (func(*clusterpb.Node) bool, error) {
	if neg, ok := strings.CutPrefix(c, "!"); ok && strings.HasPrefix(strings.TrimSpace(neg), "has(") {
		p, err := parseCondition(strings.TrimSpace(neg))
		if err != nil {
			return nil, err
		}
		return func(n *clusterpb.Node) bool { return !p(n) }, nil
	}
	if arg, ok := strings.CutPrefix(c, "has("); ok {
		role, ok := strings.CutSuffix(strings.TrimSpace(arg), ")")
		if !ok {
			return nil, fmt.Errorf("unbalanced has(...) in %q", c)
		}
		switch strings.TrimSpace(role) {
		case "node.roles.consensus_member":
			return func(n *clusterpb.Node) bool { return n.GetRoles().GetConsensusMember() != nil }, nil
		case "node.roles.kubernetes_controller":
			return func(n *clusterpb.Node) bool { return n.GetRoles().GetKubernetesController() != nil }, nil
		case "node.roles.kubernetes_worker":
			return func(n *clusterpb.Node) bool { return n.GetRoles().GetKubernetesWorker() != nil }, nil
		}
		return nil, fmt.Errorf("has() of unknown field %q", role)
	}
	op := "=="
	lhs, rhs, ok := strings.Cut(c, "==")
	if !ok {
		op = "!="
		if lhs, rhs, ok = strings.Cut(c, "!="); !ok {
			return nil, fmt.Errorf("unsupported condition %q (supported: node.FIELD == VALUE, !=, has(node.roles.ROLE), joined by &&)", c)
		}
	}
	lhs, rhs = strings.TrimSpace(lhs), strings.TrimSpace(rhs)
	// Enum constants may be qualified (plinth.cluster.v1.NODE_STATE_UP).
	enum := rhs[strings.LastIndex(rhs, ".")+1:]
	var get func(*clusterpb.Node) string
	var want string
	switch lhs {
	case "node.id":
		s, err := strconv.Unquote(rhs)
		if err != nil {
			return nil, fmt.Errorf("node.id needs a quoted string, got %s", rhs)
		}
		get, want = func(n *clusterpb.Node) string { return n.Id }, s
	case "node.state":
		if _, ok := clusterpb.NodeState_value[enum]; !ok {
			return nil, fmt.Errorf("unknown NodeState %s", rhs)
		}
		get, want = func(n *clusterpb.Node) string { return n.State.String() }, enum
	case "node.health":
		if _, ok := clusterpb.NodeHealth_value[enum]; !ok {
			return nil, fmt.Errorf("unknown NodeHealth %s", rhs)
		}
		get, want = func(n *clusterpb.Node) string { return n.Health.String() }, enum
	case "node.tpm_usage":
		if _, ok := clusterpb.NodeTPMUsage_value[enum]; !ok {
			return nil, fmt.Errorf("unknown NodeTPMUsage %s", rhs)
		}
		get, want = func(n *clusterpb.Node) string { return n.TpmUsage.String() }, enum
	default:
		return nil, fmt.Errorf("unsupported field %q (supported: node.id, node.state, node.health, node.tpm_usage)", lhs)
	}
	if op == "==" {
		return func(n *clusterpb.Node) bool { return get(n) == want }, nil
	}
	return func(n *clusterpb.Node) bool { return get(n) != want }, nil
}

func parseCert(der []byte) (*x509.Certificate, error) { return x509.ParseCertificate(der) }

func parseCRL(der []byte, ca *x509.Certificate) (*pki.CRL, error) { return pki.ParseCRL(der, ca) }
