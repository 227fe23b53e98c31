// Package launch boots Plinth nodes and clusters in QEMU, so that the VM
// tests (vmtest), the benchmarks, `plinthctl run` and `plinthctl launch`
// drive a real kernel without root and without KVM. It links no test code.
//
// A node is a QEMU process plus, unless NoTPM, its own swtpm process. The
// harness talks to QEMU through two channels only: the serial console
// (which is how the guest reports progress) and QMP (which is how a test
// presses buttons the guest would see on real hardware):
//
//	+------------------- host: this package --------------------+
//	|                                                            |
//	|  WaitForLine <-- lines <-- console reader --> console.log  |
//	|                                  ^         --> o.Console   |
//	|  PowerDown, CtrlAltDel           |                         |
//	|        |                         |                         |
//	+--------|-------------------------|-------------------------+
//	         | QMP                     | serial ttyS0
//	         | SOCKDIR/qmp.sock        | (-serial stdio)
//	         v                         |
//	+-----------------------------------+  SOCKDIR/tpm.sock  +-------+
//	| qemu-system-x86_64 (TCG, or KVM)  |<------------------>| swtpm |
//	| guest: -kernel, -initrd, disk     |    TPM commands    +-------+
//	| stderr --> WORKDIR/qemu.log       |                        |
//	+-----------------------------------+                        v
//	                                              TPMStateDir (persistent)
//
// Console lines are kept in memory from boot on, so WaitForLine can match a
// line that was printed before the caller started waiting; tests therefore
// never race the guest. A guest that powers off or reboots (QEMU runs with
// -no-reboot) makes QEMU exit, which wakes every waiter with an error that
// carries the console tail and the exit status: a test fails fast with the
// evidence instead of timing out.
//
// The console is what a node says about its boot; once a node is in a
// cluster, the cluster tests wait on what its APIs report instead (the
// curator's record, the node's own status and runnables), polled every
// second (cluster_wait.go): typed state fails with the state it saw, and
// does not break when a log message is reworded. Console lines stay
// where the console is the product's channel: /init's boot steps, a
// halted node's reason, the CA fingerprint the bootstrap node prints for
// its owner, and what a node that registers or is refused says.
//
// Unix socket paths are limited to 107 bytes, and test work directories can
// be deep, so sockets live in a short temporary directory instead of
// WorkDir. swtpm is started with --terminate so it follows QEMU's lifetime
// (including a Kill, which models a power cut); its permanent state in
// TPMStateDir survives and is picked up by the next Launch with the same
// directory, as a real TPM would be across reboots.
//
// Clusters (LaunchCluster) put nodes on a private L2 network (Switch) with
// a DHCP server, reached from the host through a router (StartRouter), and
// take ownership as an operator would; Registry is an OCI registry the
// nodes pull from.
package launch
