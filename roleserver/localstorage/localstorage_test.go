package localstorage

import (
	"os"
	"path/filepath"
	"testing"
)

func TestPlaceAndCreate(t *testing.T) {
	base := t.TempDir()
	var root Root
	if err := Place(&root, base); err != nil {
		t.Fatal(err)
	}
	for got, want := range map[string]string{
		root.Path():                                  base,
		root.Data.Path():                             filepath.Join(base, "data"),
		root.Data.Etcd.PeerPKI.Path():                filepath.Join(base, "data/etcd/peer-pki"),
		root.Data.Node.BootCount.Path():              filepath.Join(base, "data/node/boot-count"),
		root.Ephemeral.Consensus.Path():              filepath.Join(base, "ephemeral/consensus"),
		root.Ephemeral.Consensus.ClientSocket.Path(): filepath.Join(base, "ephemeral/consensus/client.sock"),
		root.Ephemeral.Kubernetes.Controller.APIServer.EtcdSocket.Path(): filepath.Join(base, "ephemeral/kubernetes/controller/apiserver/etcd.sock"),
	} {
		if got != want {
			t.Errorf("path %s, want %s", got, want)
		}
	}
	// Creating one subtree leaves the others alone.
	if err := Create(&root.Ephemeral, 0o755); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(root.Ephemeral.Log.Path()); err != nil {
		t.Error(err)
	}
	if _, err := os.Stat(root.Data.Path()); !os.IsNotExist(err) {
		t.Errorf("data created with ephemeral: %v", err)
	}
	if err := Create(&root.Data, 0o700); err != nil {
		t.Fatal(err)
	}
	if err := root.Data.Node.BootCount.Write([]byte("3\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	if b, err := root.Data.Node.BootCount.Read(); err != nil || string(b) != "3\n" {
		t.Errorf("read back %q, %v", b, err)
	}
	if err := Create(root.Data, 0o700); err == nil {
		t.Error("Create accepted a non-pointer")
	}
	var unplaced Root
	if err := Create(&unplaced, 0o700); err == nil {
		t.Error("Create of an unplaced tree succeeded")
	}
}
