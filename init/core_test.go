package main

import "testing"

// kubepodsCPUWeight is the cpu.weight the kubelet gives its kubepods
// cgroup on a node of cpus CPUs: the allocatable CPU as cpu.shares
// (1024 a CPU), converted to cgroup v2's weight by the kubelet's cgroup
// manager's linear formula (getCPUWeight in pkg/kubelet/cm).
func kubepodsCPUWeight(cpus int) int {
	shares := cpus * 1024
	return 1 + ((shares-2)*9999)/262142
}

// TestCPUWeights checks the order setupCgroups gives the CPU under
// contention, on nodes of every size, against the pods' weight the
// kubelet sets: the runtime keeps at least one CPU against pods that
// take every CPU they can (the pulls and container starts they wait
// for), and the core keeps twice the runtime's share when everything is
// busy (the control plane first, but not so far first that a
// controller's own kubelet and pods starve).
func TestCPUWeights(t *testing.T) {
	for _, cpus := range []int{2, 3, 4, 8, 16, 64, 256} {
		pods := kubepodsCPUWeight(cpus)
		runtime := float64(cpus) * runtimeCPUWeight / float64(runtimeCPUWeight+pods)
		if runtime < 1 {
			t.Errorf("%d CPUs: the runtime gets %.2f CPUs beside busy pods (weights %d against %d), want at least one", cpus, runtime, runtimeCPUWeight, pods)
		}
	}
	if coreCPUWeight < 2*runtimeCPUWeight {
		t.Errorf("the core's weight %d is less than twice the runtime's %d", coreCPUWeight, runtimeCPUWeight)
	}
	if got := kubepodsCPUWeight(2); got != 79 {
		t.Errorf("kubepods on 2 CPUs: weight %d, want 79 (the kubelet's, as the comment in setupCgroups says)", got)
	}
}
