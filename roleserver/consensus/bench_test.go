package consensus

import (
	"context"
	"fmt"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
)

// Benchmarks of the consensus service on loopback, with the test Tuning
// (50ms heartbeat, 500ms election timeout, no fsync): they measure this
// package's own overhead, not a disk.
//
//	go test -run '^$' -bench . -benchtime 3x ./roleserver/consensus/
//
// They need no TestMain: benchMember sets up a member per benchmark and
// registers its teardown with b.Cleanup.

// benchMember bootstraps a one-member cluster and returns it running.
func benchMember(b *testing.B, name string) (*member, *Status) {
	b.Helper()
	m := newMember(b, name)
	m.start(nil)
	return m, m.running(time.Minute)
}

// BenchmarkBootstrap: from Run to a running first member (temporary
// loopback etcd, PKI creation, restart with peer mTLS).
func BenchmarkBootstrap(b *testing.B) {
	for i := 0; i < b.N; i++ {
		b.StopTimer()
		m := newMember(b, fmt.Sprintf("node-%d", i))
		b.StartTimer()
		m.start(nil)
		m.running(time.Minute)
		b.StopTimer()
		m.stop()
		b.StartTimer()
	}
}

// BenchmarkAddNodeToPromoted: from AddNode to the new member being a voter
// (certificate issue, learner add, join, catch-up, autopromotion). Between
// iterations the new member is removed again, untimed: etcd only allows the
// removal once it has been connected for 5s.
func BenchmarkAddNodeToPromoted(b *testing.B) {
	ctx := context.Background()
	_, st := benchMember(b, "node-a")
	for i := 0; i < b.N; i++ {
		b.StopTimer()
		n := newMember(b, fmt.Sprintf("node-%d", i))
		b.StartTimer()
		jc, err := st.AddNode(ctx, n.name, n.pub(), n.addOption())
		if err != nil {
			b.Fatal(err)
		}
		n.start(jc)
		for {
			ml, err := st.ClusterClient().MemberList(ctx)
			if err != nil {
				b.Fatal(err)
			}
			if m := findMember(ml.Members, n.name, "https://"+n.peerAddr()); m != nil && !m.IsLearner {
				break
			}
			time.Sleep(10 * time.Millisecond)
		}
		b.StopTimer()
		eventually(b, time.Minute, "removing "+n.name, func() error { return st.RemoveNode(ctx, n.name) })
		n.stop()
		b.StartTimer()
	}
}

// warmUp keeps connection setup and the first requests out of the timed
// loop, which matters when a benchmark runs only a few iterations.
func warmUp(b *testing.B, kvs ...clientv3.KV) {
	for _, kv := range kvs {
		for i := 0; i < 100; i++ {
			if _, err := kv.Put(context.Background(), "bench/warmup", "value"); err != nil {
				b.Fatal(err)
			}
		}
	}
}

func putLoop(b *testing.B, kv clientv3.KV) time.Duration {
	ctx := context.Background()
	start := time.Now()
	for i := 0; i < b.N; i++ {
		if _, err := kv.Put(ctx, fmt.Sprintf("bench/%d", i%1000), "value"); err != nil {
			b.Fatal(err)
		}
	}
	return time.Since(start)
}

// BenchmarkPutNamespaced: one Put through CuratorClient. It also times as
// many raw Puts on the same cluster afterwards and reports the ratio, so
// the namespace overhead is visible without comparing two clusters.
func BenchmarkPutNamespaced(b *testing.B) {
	_, st := benchMember(b, "node-a")
	cur, err := st.CuratorClient()
	if err != nil {
		b.Fatal(err)
	}
	defer cur.Close()
	warmUp(b, cur, st.be)
	b.ResetTimer()
	ns := putLoop(b, cur)
	b.StopTimer()
	raw := putLoop(b, st.be)
	b.ReportMetric(float64(raw.Nanoseconds())/float64(b.N), "raw-ns/op")
	b.ReportMetric(float64(ns)/float64(raw), "ns/raw-ratio")
}

// BenchmarkPutRaw: one Put through the member's unnamespaced client.
func BenchmarkPutRaw(b *testing.B) {
	_, st := benchMember(b, "node-a")
	warmUp(b, st.be)
	b.ResetTimer()
	putLoop(b, st.be)
}
