// Package vmtest holds the VM tests: real Plinth nodes and clusters in
// QEMU with swtpm, booted through package launch (which plinthctl and
// the benchmarks use too), asserting what the node's APIs and console
// report. Its files are tests only (build tag built: they need what make
// builds); the launcher's own tests are in package launch.
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
