package main

import "plinth.dev/plinth/launch"

// accel names the acceleration QEMU will use (run, launch).
func accel() string {
	if launch.KVMAvailable() {
		return "KVM"
	}
	return "TCG (no KVM)"
}
