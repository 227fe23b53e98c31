// Package vmtest boots one Plinth node in QEMU so that tests, benchmarks
// and `make run` can drive a real kernel without root and without KVM.
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
// # Parallel tests
//
// go test runs the top-level tests that call t.Parallel() after the
// others. Under TCG a booting node keeps one host core busy for most of
// its boot (firmware, kernel, /init are largely single-threaded), so two
// such tests side by side take little longer than one and `make test`
// stays inside its time budget. The parallel tests call parallel(t,
// about) instead of t.Parallel: a pool of GOMAXPROCS slots (2 on CI)
// starts the longest first, by the duration each states (measured on
// CI), so the phase ends soonest; `make vmtest` lifts go test's own
// -parallel limit, which would start them in no particular order. In the
// pool: the storage, data disk and node tests, TestRunFirstMinutes (what
// `make run` starts, Kubernetes included, driven as it prints), and the
// OVMF tests TestDiskBoot, TestGenericBoard, TestUpdate (a one-node
// cluster booted from its disk) and TestNetBoot, whose second node spends
// most of its time in firmware fetching the UKI over HTTP on one vCPU. The cluster
// tests stay serial: even idle, three TCG members with etcd keep a core
// busy (tried: TestCluster and a three-member failover test in the pool
// more than doubled both and the tests beside them).
//
// The serial three-member tests are TestCluster and
// TestRollingUpdateAndFailover, which updates its members one by one
// while a writer writes and then cuts the power of the curator leader:
// one launch of three members (~1.5 min under TCG) serves both.
package vmtest
