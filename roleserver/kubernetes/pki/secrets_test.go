package pki

import (
	"encoding/json"
	"errors"
	"fmt"
	"testing"
	"time"

	"go.etcd.io/etcd/client/v3/namespace"
)

// TestSecretsKeyRotation: the first key is made once; a rotation adds a
// read-only key, activates it (the old one reads), retires the old one,
// each step once however often it is asked for, and out of order never.
func TestSecretsKeyRotation(t *testing.T) {
	p := New(newKV(t))
	k, _, err := p.SecretsKeys(ctx(t))
	if err != nil || k.Generation != 1 || len(k.Keys) != 1 || !k.Keys[0].Write || len(k.Keys[0].Secret) != 32 {
		t.Fatalf("first keys: %+v, %v", k, err)
	}
	if again, _, _ := p.SecretsKeys(ctx(t)); string(again.Keys[0].Secret) != string(k.Keys[0].Secret) {
		t.Fatal("SecretsKeys made another first key")
	}
	if _, err := p.RotateSecretsKeys(ctx(t), RotateActivate); !errors.Is(err, ErrRotation) {
		t.Errorf("activate before add: %v", err)
	}
	step := func(s string, gen uint64, writer string, names ...string) *SecretsKeys {
		t.Helper()
		k, err := p.RotateSecretsKeys(ctx(t), s)
		if err != nil {
			t.Fatalf("%s: %v", s, err)
		}
		var got []string
		w := ""
		for _, key := range k.Keys {
			got = append(got, key.Name)
			if key.Write {
				w = key.Name
			}
		}
		if k.Generation != gen || w != writer || len(got) != len(names) {
			t.Fatalf("after %s: generation %d, writer %s, keys %v; want %d, %s, %v", s, k.Generation, w, got, gen, writer, names)
		}
		return k
	}
	step(RotateAdd, 2, "key-1", "key-1", "key-2")
	step(RotateAdd, 2, "key-1", "key-1", "key-2") // again: nothing
	if _, err := p.RotateSecretsKeys(ctx(t), RotateRetire); !errors.Is(err, ErrRotation) {
		t.Errorf("retire before activate: %v", err)
	}
	active := step(RotateActivate, 3, "key-2", "key-1", "key-2")
	step(RotateActivate, 3, "key-2", "key-1", "key-2")
	// The write key comes first, then the other, then plaintext reads.
	var cfg struct {
		Resources []struct {
			Resources []string
			Providers []map[string]json.RawMessage
		}
	}
	if err := json.Unmarshal(active.EncryptionConfiguration(), &cfg); err != nil || len(cfg.Resources) != 1 || cfg.Resources[0].Resources[0] != "secrets" {
		t.Fatalf("encryption configuration: %v %+v", err, cfg)
	}
	var box struct {
		Keys []struct{ Name, Secret string }
	}
	json.Unmarshal(cfg.Resources[0].Providers[0]["secretbox"], &box)
	if len(box.Keys) != 2 || box.Keys[0].Name != "key-2" || box.Keys[1].Name != "key-1" || cfg.Resources[0].Providers[1]["identity"] == nil {
		t.Errorf("providers: %s", active.EncryptionConfiguration())
	}
	step(RotateRetire, 4, "key-2", "key-2")
	step(RotateRetire, 4, "key-2", "key-2")
	step(RotateAdd, 5, "key-2", "key-2", "key-5")
	if _, err := p.RotateSecretsKeys(ctx(t), "shred"); !errors.Is(err, ErrRotation) {
		t.Errorf("unknown step: %v", err)
	}

	if err := p.SetSecretsLoaded(ctx(t), "plinth-a", 5); err != nil {
		t.Fatal(err)
	}
	if got, err := p.SecretsLoaded(ctx(t)); err != nil || len(got) != 1 || got["plinth-a"] != 5 {
		t.Errorf("loaded generations: %v, %v", got, err)
	}
}

// TestWatchSecretsKeysAcrossCompaction: a control plane that watches
// its keys after the compactor passed the revision it read them at (a
// slow start: the watch begins once its API server serves) is not told
// they changed: before, the watch failed on the compacted revision, which
// read as a change, and the control plane restarted and did it again.
// A real change after that still ends the watch.
func TestWatchSecretsKeysAcrossCompaction(t *testing.T) {
	prefix := fmt.Sprintf("/test-%d/curator", prefixes.Add(1))
	p := New(namespace.NewKV(etcdClient.KV, prefix))
	w := namespace.NewWatcher(etcdClient.Watcher, prefix)
	defer w.Close()
	if _, _, err := p.SecretsKeys(ctx(t)); err != nil {
		t.Fatal(err)
	}
	_, rev, err := p.SecretsKeys(ctx(t))
	if err != nil {
		t.Fatal(err)
	}
	// Compacted up to past rev+1, where the watch starts.
	var last int64
	for range 3 {
		resp, err := etcdClient.Put(ctx(t), prefix+"/other", "x")
		if err != nil {
			t.Fatal(err)
		}
		last = resp.Header.Revision
	}
	if _, err := etcdClient.Compact(ctx(t), last); err != nil {
		t.Fatal(err)
	}
	changed := p.WatchSecretsKeys(ctx(t), w, rev)
	select {
	case <-changed:
		t.Fatal("the keys reported changed after a compaction, unchanged")
	case <-time.After(time.Second):
	}
	if _, err := p.RotateSecretsKeys(ctx(t), RotateAdd); err != nil {
		t.Fatal(err)
	}
	select {
	case <-changed:
	case <-time.After(30 * time.Second):
		t.Fatal("a rotation after the compaction not reported")
	}
}
