package main

import "plinth.dev/plinth/vmtest"

// accel names the acceleration QEMU will use (run, launch).
func accel() string {
	if vmtest.KVMAvailable() {
		return "KVM"
	}
	return "TCG (no KVM)"
}
