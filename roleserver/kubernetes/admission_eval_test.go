package kubernetes

import (
	"context"
	"encoding/json"
	"testing"

	"github.com/google/cel-go/cel"
	"github.com/google/cel-go/common/types"
	"github.com/google/cel-go/common/types/ref"
	"github.com/google/cel-go/ext"
	"k8s.io/apiserver/pkg/authentication/user"
	"k8s.io/apiserver/pkg/authorization/authorizer"
	"k8s.io/apiserver/pkg/cel/library"
)

// policyRequest is one admission request a generated static policy is
// evaluated on: the object, the old one (nil: a creation), who asks and
// what the authorizer answers them.
type policyRequest struct {
	object, old map[string]any
	user        string
	// allow answers the authorizer's checks (nil: everything denied).
	allow func(authorizer.Attributes) bool
}

// policyResult is what the policy made of a request: its variables,
// whether every validation passed and the first failure's message.
type policyResult struct {
	vars    map[string]any
	ok      bool
	message string
}

// evalPolicy evaluates the ValidatingAdmissionPolicy of a generated
// static manifest as the API server does: its variables in order, then
// each validation (and the failing one's messageExpression), with
// Kubernetes' CEL libraries the policies use (strings, optionals, IP and
// CIDR, the authorizer). The real API server runs them in
// TestControlPlaneOnHost.
func evalPolicy(t *testing.T, manifest []byte, r policyRequest) policyResult {
	t.Helper()
	var list struct {
		Items []struct {
			Kind string
			Spec struct {
				Variables   []struct{ Name, Expression string }
				Validations []struct{ Expression, MessageExpression string }
			}
		}
	}
	if err := json.Unmarshal(manifest, &list); err != nil || len(list.Items) != 2 || list.Items[0].Kind != "ValidatingAdmissionPolicy" {
		t.Fatalf("the policy: %v\n%s", err, manifest)
	}
	env, err := cel.NewEnv(ext.Strings(), cel.OptionalTypes(), library.IP(), library.CIDR(), library.Authz(),
		cel.Variable("object", cel.DynType), cel.Variable("oldObject", cel.DynType), cel.Variable("request", cel.DynType),
		cel.Variable("authorizer", library.AuthorizerType), cel.Variable("variables", cel.MapType(cel.StringType, cel.DynType)))
	if err != nil {
		t.Fatal(err)
	}
	operation := "CREATE"
	var old any
	if r.old != nil {
		operation, old = "UPDATE", r.old
	}
	u := &user.DefaultInfo{Name: r.user}
	vars := map[string]any{}
	input := map[string]any{"object": r.object, "oldObject": old, "variables": vars,
		"request":    map[string]any{"operation": operation, "userInfo": map[string]any{"username": r.user}},
		"authorizer": library.NewAuthorizerVal(u, testAuthorizer(r.allow))}
	eval := func(expr string) ref.Val {
		t.Helper()
		ast, iss := env.Compile(expr)
		if iss.Err() != nil {
			t.Fatalf("compiling %s: %v", expr, iss.Err())
		}
		prg, err := env.Program(ast)
		if err != nil {
			t.Fatal(err)
		}
		out, _, err := prg.Eval(input)
		if err != nil {
			t.Fatalf("evaluating %s: %v", expr, err)
		}
		return out
	}
	spec := list.Items[0].Spec
	for _, v := range spec.Variables {
		vars[v.Name] = eval(v.Expression)
	}
	res := policyResult{vars: vars, ok: true}
	for _, v := range spec.Validations {
		if eval(v.Expression) != types.True {
			res.ok, res.message = false, eval(v.MessageExpression).Value().(string)
			break
		}
	}
	return res
}

// testAuthorizer answers as allow says.
type testAuthorizer func(authorizer.Attributes) bool

func (a testAuthorizer) Authorize(_ context.Context, attr authorizer.Attributes) (authorizer.Decision, string, error) {
	if a != nil && a(attr) {
		return authorizer.DecisionAllow, "", nil
	}
	return authorizer.DecisionNoOpinion, "", nil
}
