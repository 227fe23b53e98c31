package kubernetes

import (
	"encoding/json"
	"fmt"
	"strings"
	"testing"
)

// TestAuthorizationConfig: no webhook while no node is decommissioned;
// the decommissioned nodes' users alone, refused even when the webhook
// cannot answer; every node user asked, the webhook deciding, while the
// set is unread or too long to list.
func TestAuthorizationConfig(t *testing.T) {
	type webhook struct {
		FailurePolicy   string `json:"failurePolicy"`
		MatchConditions []struct {
			Expression string `json:"expression"`
		} `json:"matchConditions"`
	}
	parse := func(b []byte) (types []string, w *webhook) {
		var c struct {
			Authorizers []struct {
				Type    string   `json:"type"`
				Webhook *webhook `json:"webhook"`
			} `json:"authorizers"`
		}
		if err := json.Unmarshal(b, &c); err != nil {
			t.Fatal(err)
		}
		for _, a := range c.Authorizers {
			types = append(types, a.Type)
			if a.Webhook != nil {
				w = a.Webhook
			}
		}
		return types, w
	}
	prefixes := "request.user.startsWith('system:node:') || request.user.startsWith('plinth:node-proxies:') || request.user.startsWith('plinth:local-volumes:')"

	if types, _ := parse(authorizationConfig("/d", nil, true)); strings.Join(types, ",") != "Node,RBAC" {
		t.Errorf("none decommissioned: %v", types)
	}
	types, w := parse(authorizationConfig("/d", []string{"plinth-b", "plinth-a"}, true))
	want := `request.user in ["plinth:local-volumes:plinth-a", "plinth:local-volumes:plinth-b", "plinth:node-proxies:plinth-a", "plinth:node-proxies:plinth-b", "system:node:plinth-a", "system:node:plinth-b"]`
	if strings.Join(types, ",") != "Webhook,Node,RBAC" || w.FailurePolicy != "Deny" || w.MatchConditions[0].Expression != want {
		t.Errorf("two decommissioned: %v %+v", types, w)
	}
	if string(authorizationConfig("/d", []string{"plinth-a", "plinth-b"}, true)) != string(authorizationConfig("/d", []string{"plinth-b", "plinth-a"}, true)) {
		t.Error("the same set gives other bytes")
	}
	if _, w := parse(authorizationConfig("/d", nil, false)); w == nil || w.FailurePolicy != "NoOpinion" || w.MatchConditions[0].Expression != prefixes {
		t.Errorf("unread: %+v", w)
	}
	many := make([]string, 1000)
	for i := range many {
		many[i] = fmt.Sprintf("plinth-%032x", i)
	}
	if _, w := parse(authorizationConfig("/d", many, true)); w == nil || w.FailurePolicy != "NoOpinion" || w.MatchConditions[0].Expression != prefixes {
		t.Errorf("1000 decommissioned: %+v", w)
	}
	if _, w := parse(authorizationConfig("/d", many[:300], true)); w == nil || w.FailurePolicy != "Deny" || len(w.MatchConditions[0].Expression) > maxListedUsers {
		t.Errorf("300 decommissioned: not listed, or over %d characters", maxListedUsers)
	}
}
