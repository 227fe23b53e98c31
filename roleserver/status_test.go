package roleserver

import (
	"strings"
	"testing"

	"plinth.dev/plinth/platform/supervisor"
)

// TestCrashLoopsInStatus: a runnable that failed three times in a row
// (a Kubernetes component that keeps crashing) shows in the node status.
func TestCrashLoopsInStatus(t *testing.T) {
	s := New(Config{})
	p := s.status([]supervisor.Status{
		{DN: "root.roleserver.kubernetes.worker.kubelet", Failures: 3, LastErr: "exit status 1"},
		{DN: "root.roleserver.kubernetes.worker.proxy", Failures: 2, LastErr: "exit status 1"},
	}).GetProblems()
	if len(p) != 1 || p[0].GetComponent() != "root.roleserver.kubernetes.worker.kubelet" || !strings.Contains(p[0].GetMessage(), "3 times in a row") {
		t.Fatalf("problems %v", p)
	}
}
