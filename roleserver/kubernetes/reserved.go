package kubernetes

import (
	"fmt"
	"os"
	"strconv"
	"strings"
)

// What the kubelet keeps from pods (its systemReserved), so that pods
// cannot take the memory the node itself runs on:
//
//	 node memory (MemTotal)
//	┌──────────────────────────────────────────────────────────────┐
//	│ kubepods: memory.max = total − reserved                        │ ← pods, OOM-killed
//	│   (allocatable = that − evictionHard: what the scheduler      │   inside it when
//	│    places pods' requests against)                             │   they outgrow it
//	├──────────────────────────────────────────────────────────────┤
//	│ reserved: the node OS (Role Server, containerd and one shim    │
//	│ per pod, kubelet, kube-proxy, DNS, network policy)             │
//	│ + on a controller the control plane (etcd, API server,        │
//	│   controller manager, scheduler, curator)                     │
//	└──────────────────────────────────────────────────────────────┘
//
// Why: everything but the pods runs outside the kubelet's kubepods
// cgroup, and without a reservation kubepods may use all of the node's
// memory. Pods that outgrow it then do not meet an OOM kill of their
// own: the kernel first evicts what it can, the programs' pages of the
// control plane and the runtime, and the node thrashes (measured: a
// 2 GiB `plinthctl run` node with 100 idle pods, TLS handshakes timing
// out and no OOM kill). With enforceNodeAllocatable "pods" the kubelet
// sets kubepods' memory.max to the total less this reservation, so pods
// reclaim and are OOM-killed within it, and the scheduler counts only
// the rest.
//
// The node OS's share follows the usual sliding scale (25 % of the
// first 4 GiB, 20 % of the next 4, 10 % of the next 8, 6 % of the next
// 112, 2 % above); a controller adds its control plane's, which Talos
// and kubeadm clusters count in kubepods as static pods but Plinth runs
// beside the kubelet.
type reservation struct {
	MemoryMiB int64
	CPUMilli  int64
}

const (
	// controlPlaneMemoryMiB is the control plane's resident memory on a
	// two-node cluster under the conformance suite's load (API server,
	// etcd, controller manager, scheduler, curator: see the README's
	// Kubernetes section).
	controlPlaneMemoryMiB = 768
	// nodeCPUMilli and controlPlaneCPUMilli are the CPU kept from pods'
	// requests (the scheduler's arithmetic; the core's cgroups already
	// outweigh kubepods when both want the CPU).
	nodeCPUMilli         = 100
	controlPlaneCPUMilli = 200
	// evictionMemoryAvailable is the kubelet's hard eviction threshold
	// for memory (its upstream default).
	evictionMemoryAvailable = "100Mi"
)

// reserve is the reservation of a node with totalMiB of memory, with
// the control plane if controlPlane.
func reserve(totalMiB int64, controlPlane bool) reservation {
	r := reservation{MemoryMiB: slidingScale(totalMiB), CPUMilli: nodeCPUMilli}
	if controlPlane {
		r.MemoryMiB += controlPlaneMemoryMiB
		r.CPUMilli += controlPlaneCPUMilli
	}
	// Pods keep at least a quarter of the node, however small.
	if most := totalMiB * 3 / 4; r.MemoryMiB > most {
		r.MemoryMiB = most
	}
	return r
}

// slidingScale is the node OS's share of totalMiB.
func slidingScale(totalMiB int64) int64 {
	steps := []struct{ sizeMiB, percent int64 }{
		{4 << 10, 25}, {4 << 10, 20}, {8 << 10, 10}, {112 << 10, 6}, {1 << 50, 2},
	}
	var r int64
	left := totalMiB
	for _, s := range steps {
		n := min(left, s.sizeMiB)
		r += n * s.percent / 100
		left -= n
		if left <= 0 {
			break
		}
	}
	return max(r, 256)
}

// kubeletReserved is the KubeletConfiguration's systemReserved.
func (r reservation) kubeletReserved() map[string]string {
	return map[string]string{
		"memory": strconv.FormatInt(r.MemoryMiB, 10) + "Mi",
		"cpu":    strconv.FormatInt(r.CPUMilli, 10) + "m",
	}
}

// memTotalMiB is MemTotal of /proc/meminfo (what the kubelet reports as
// the node's memory capacity) in MiB.
func memTotalMiB(meminfo string) (int64, error) {
	b, err := os.ReadFile(meminfo)
	if err != nil {
		return 0, err
	}
	for _, l := range strings.Split(string(b), "\n") {
		f := strings.Fields(l)
		if len(f) == 3 && f[0] == "MemTotal:" && f[2] == "kB" {
			kb, err := strconv.ParseInt(f[1], 10, 64)
			if err != nil {
				return 0, fmt.Errorf("%s: MemTotal %q: %w", meminfo, f[1], err)
			}
			return kb >> 10, nil
		}
	}
	return 0, fmt.Errorf("%s has no MemTotal in kB", meminfo)
}
