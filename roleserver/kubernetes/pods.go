package kubernetes

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strconv"
	"syscall"

	"plinth.dev/plinth/platform/layout"
)

// podCgroup is where the kubelet puts every pod (cgroupfs driver, cgroup
// root "/", a cgroup per QoS class below it).
const podCgroup = "/sys/fs/cgroup/kubepods"

// runtimeCgroup is where containerd (with its shims) and the kubelet run
// (init makes it, at a CPU weight below the core's and above the pods').
const runtimeCgroup = "/sys/fs/cgroup/runtime"

// StopPods ends what the node's pods left running once the worker has
// stopped: every process in the pods' cgroups (cgroup.kill) and the
// containerd shims, which outlive containerd on purpose. A node without
// the KubernetesWorker role runs no workload: without a kubelet nothing
// would manage, restart or report those containers. Their images and
// state on /data stay; with the role back, the kubelet starts the pods
// bound to the node again. It returns how many shims it killed.
func StopPods() (int, error) {
	return stopPods(podCgroup, "/proc", layout.ContainerdShimBinary)
}

func stopPods(cgroup, proc, shim string) (int, error) {
	var errs []error
	if err := os.WriteFile(filepath.Join(cgroup, "cgroup.kill"), []byte("1"), 0); err != nil && !errors.Is(err, fs.ErrNotExist) {
		errs = append(errs, fmt.Errorf("killing the pods' processes: %w", err))
	}
	entries, err := os.ReadDir(proc)
	if err != nil {
		return 0, errors.Join(append(errs, err)...)
	}
	killed := 0
	for _, e := range entries {
		pid, err := strconv.Atoi(e.Name())
		if err != nil || pid == os.Getpid() {
			continue
		}
		if exe, err := os.Readlink(filepath.Join(proc, e.Name(), "exe")); err != nil || exe != shim {
			continue
		}
		if err := syscall.Kill(pid, syscall.SIGKILL); err != nil && !errors.Is(err, syscall.ESRCH) {
			errs = append(errs, fmt.Errorf("killing shim %d: %w", pid, err))
			continue
		}
		killed++
	}
	return killed, errors.Join(errs...)
}
