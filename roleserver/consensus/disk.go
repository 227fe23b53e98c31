package consensus

import (
	"bytes"
	"context"
	"crypto/ed25519"
	"crypto/x509"
	"errors"
	"fmt"
	"net/url"
	"os"
	"path/filepath"
	"time"

	"go.etcd.io/bbolt"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.etcd.io/etcd/server/v3/storage/wal"
	"go.uber.org/zap"

	"plinth.dev/plinth/platform/atomicfile"
	"plinth.dev/plinth/platform/pki"
	"plinth.dev/plinth/platform/supervisor"
	"plinth.dev/plinth/roleserver/localstorage"
)

// disk is the member's persistent state: etcd's data directory and the
// peer PKI files etcd reads (it only takes file names, never keys in
// memory).
type disk struct {
	dir *localstorage.DataEtcdDirectory
}

func newDisk(dir *localstorage.DataEtcdDirectory) disk { return disk{dir: dir} }

func (d disk) dataDir() string  { return d.dir.Data.Path() }
func (d disk) pkiDir() string   { return d.dir.PeerPKI.Path() }
func (d disk) caPath() string   { return filepath.Join(d.pkiDir(), "ca.pem") }
func (d disk) certPath() string { return filepath.Join(d.pkiDir(), "cert.pem") }
func (d disk) keyPath() string  { return filepath.Join(d.pkiDir(), "key.pem") }

// crlPath holds the CRL in DER: etcd parses it with
// x509.ParseRevocationList on every peer connection, which takes no PEM.
func (d disk) crlPath() string { return filepath.Join(d.pkiDir(), "crl.der") }

// bootstrapDir is where a new cluster is built before it is moved into
// place; its presence marks a bootstrap that did not finish.
func (d disk) bootstrapDir() string { return filepath.Join(d.dir.Path(), "bootstrap.tmp") }

// hasWAL mirrors etcd's own test for "this member has state": a member
// directory without WAL files is a join that failed before its first raft
// entry, which etcd simply retries.
func (d disk) hasWAL() (bool, error) {
	walDir := filepath.Join(d.dataDir(), "member", "wal")
	if _, err := os.Stat(walDir); errors.Is(err, os.ErrNotExist) {
		return false, nil
	} else if err != nil {
		return false, fmt.Errorf("consensus: inspecting %s: %w", walDir, err)
	}
	return wal.Exist(walDir), nil
}

func (d disk) hasPKI() bool {
	for _, p := range []string{d.caPath(), d.certPath(), d.keyPath()} {
		if _, err := os.Stat(p); err == nil {
			return true
		}
	}
	return false
}

func (d disk) hasUnfinishedBootstrap() bool {
	_, err := os.Stat(d.bootstrapDir())
	return err == nil
}

func (d disk) readCA() (*x509.Certificate, error) {
	b, err := os.ReadFile(d.caPath())
	if err != nil {
		return nil, fmt.Errorf("consensus: reading cluster CA: %w", err)
	}
	ca, err := pki.ParseCertificatePEM(b)
	if err != nil {
		return nil, fmt.Errorf("consensus: parsing cluster CA %s: %w", d.caPath(), err)
	}
	return ca, nil
}

// checkPKI makes sure a restarting member has usable peer credentials
// before etcd gets to them: etcd would only log failed handshakes and never
// become ready, which is a much worse error than this one.
func (d disk) checkPKI(priv ed25519.PrivateKey) error {
	ca, err := d.readCA()
	if err != nil {
		return err
	}
	b, err := os.ReadFile(d.certPath())
	if err != nil {
		return fmt.Errorf("consensus: reading member certificate: %w", err)
	}
	cert, err := pki.ParseCertificatePEM(b)
	if err != nil {
		return fmt.Errorf("consensus: parsing member certificate %s: %w", d.certPath(), err)
	}
	if err := checkCertForKey(cert, priv); err != nil {
		return err
	}
	if err := pki.Verify(ca, nil, cert, pki.UsageServerAndClient); err != nil {
		return fmt.Errorf("consensus: member certificate on disk: %w", err)
	}
	if b, err = os.ReadFile(d.keyPath()); err != nil {
		return fmt.Errorf("consensus: reading member key: %w", err)
	}
	key, err := pki.ParsePrivateKeyPEM(b)
	if err != nil {
		return fmt.Errorf("consensus: parsing member key %s: %w", d.keyPath(), err)
	}
	if !key.Equal(priv) {
		return fmt.Errorf("consensus: member key %s is not this node's key", d.keyPath())
	}
	if b, err = os.ReadFile(d.crlPath()); err != nil {
		return fmt.Errorf("consensus: reading CRL: %w", err)
	}
	if _, err := pki.ParseCRL(b, ca); err != nil {
		return fmt.Errorf("consensus: CRL %s: %w", d.crlPath(), err)
	}
	return nil
}

func checkCertForKey(cert *x509.Certificate, priv ed25519.PrivateKey) error {
	pub, ok := cert.PublicKey.(ed25519.PublicKey)
	if !ok || !pub.Equal(priv.Public()) {
		return fmt.Errorf("consensus: certificate %q is not for this node's key", cert.Subject.CommonName)
	}
	return nil
}

// validateJoin catches a JoinCluster meant for another node or another
// cluster before anything is written to disk.
func validateJoin(j *JoinCluster, priv ed25519.PrivateKey) error {
	if j.CACertificate == nil || j.NodeCertificate == nil || j.InitialCRL == nil {
		return errors.New("consensus: JoinCluster lacks the CA certificate, node certificate or CRL")
	}
	if err := checkCertForKey(j.NodeCertificate, priv); err != nil {
		return fmt.Errorf("%w (JoinCluster was issued for another node)", err)
	}
	if err := pki.Verify(j.CACertificate, j.InitialCRL, j.NodeCertificate, pki.UsageServerAndClient); err != nil {
		return fmt.Errorf("consensus: JoinCluster node certificate: %w", err)
	}
	if len(j.ExistingNodes) == 0 {
		return errors.New("consensus: JoinCluster names no existing members to contact")
	}
	for _, n := range j.ExistingNodes {
		if _, err := url.Parse(n.URL); err != nil || n.URL == "" {
			return fmt.Errorf("consensus: JoinCluster member %q has an invalid peer URL %q", n.Name, n.URL)
		}
	}
	return nil
}

func (d disk) writePKI(ca, cert *x509.Certificate, key ed25519.PrivateKey, crl *pki.CRL) error {
	keyPEM, err := pki.PrivateKeyPEM(key)
	if err != nil {
		return err
	}
	for _, f := range []struct {
		path string
		data []byte
		perm os.FileMode
	}{
		{d.caPath(), pki.CertificatePEM(ca), 0o644},
		{d.certPath(), pki.CertificatePEM(cert), 0o644},
		{d.keyPath(), keyPEM, 0o600},
		{d.crlPath(), crl.Raw, 0o644},
	} {
		if err := atomicfile.Write(f.path, f.data, f.perm); err != nil {
			return fmt.Errorf("consensus: writing peer PKI: %w", err)
		}
	}
	return nil
}

func syncDir(dir string) error {
	f, err := os.Open(dir)
	if err != nil {
		return err
	}
	defer f.Close()
	return f.Sync()
}

// crlWatcher keeps the CRL file etcd checks in step with the CRL in etcd,
// so that a certificate revoked on any member is refused by every member.
func (d disk) crlWatcher(be *backend) supervisor.Runnable {
	return func(ctx context.Context) error {
		ca, err := d.readCA()
		if err != nil {
			return err
		}
		resp, err := be.Get(ctx, keyCRL)
		if err != nil {
			return fmt.Errorf("reading CRL: %w", err)
		}
		for _, kv := range resp.Kvs {
			if err := d.updateCRL(ctx, ca, kv.Value); err != nil {
				return err
			}
		}
		supervisor.Signal(ctx, supervisor.SignalHealthy)
		// A compacted start revision ends the watch with an error; the
		// supervisor restarts us and we read the CRL afresh.
		w := be.newWatcher()
		defer w.Close()
		for wr := range w.Watch(ctx, keyCRL, clientv3.WithRev(resp.Header.Revision+1)) {
			if err := wr.Err(); err != nil {
				return fmt.Errorf("watching CRL: %w", err)
			}
			for _, ev := range wr.Events {
				if ev.Type != clientv3.EventTypePut {
					continue
				}
				if err := d.updateCRL(ctx, ca, ev.Kv.Value); err != nil {
					return err
				}
			}
		}
		if ctx.Err() != nil {
			return ctx.Err()
		}
		return errors.New("CRL watch closed")
	}
}

func (d disk) updateCRL(ctx context.Context, ca *x509.Certificate, der []byte) error {
	// Whatever lands in the file decides who may talk to this member: only
	// a CRL signed by the cluster CA gets there.
	if _, err := pki.ParseCRL(der, ca); err != nil {
		return fmt.Errorf("CRL in etcd: %w", err)
	}
	if old, err := os.ReadFile(d.crlPath()); err == nil && bytes.Equal(old, der) {
		return nil
	}
	if err := atomicfile.Write(d.crlPath(), der, 0o644); err != nil {
		return fmt.Errorf("writing CRL: %w", err)
	}
	supervisor.Logger(ctx).Info("CRL updated", "path", d.crlPath())
	return nil
}

// verifyDataDir reads etcd's WAL and backend without modifying them (etcd
// itself would repair a torn WAL tail or move a broken snapshot aside), so
// that a damaged directory becomes a clear error here rather than a panic
// inside etcd, which in PID 1 would take the whole node down.
func verifyDataDir(lg *zap.Logger, dataDir string) (err error) {
	defer func() {
		if r := recover(); r != nil {
			err = fmt.Errorf("panic while reading: %v", r)
		}
	}()
	lg = lg.Named("verify")
	walDir := filepath.Join(dataDir, "member", "wal")
	snaps, err := wal.ValidSnapshotEntries(lg, walDir)
	if err != nil {
		return fmt.Errorf("WAL %s: %w", walDir, err)
	}
	if len(snaps) == 0 {
		return fmt.Errorf("WAL %s: no snapshot record", walDir)
	}
	walSnap := snaps[len(snaps)-1]
	if _, err := wal.Verify(lg, walDir, walSnap); err != nil {
		return fmt.Errorf("WAL %s: %w", walDir, err)
	}
	dbPath := filepath.Join(dataDir, "member", "snap", "db")
	if _, err := os.Stat(dbPath); err != nil {
		return fmt.Errorf("backend: %w", err)
	}
	db, err := bbolt.Open(dbPath, 0o600, &bbolt.Options{ReadOnly: true, Timeout: 10 * time.Second})
	if err != nil {
		return fmt.Errorf("backend %s: %w", dbPath, err)
	}
	defer db.Close()
	return db.View(func(tx *bbolt.Tx) error {
		for err := range tx.Check() {
			return fmt.Errorf("backend %s: %w", dbPath, err)
		}
		return nil
	})
}
