package roleserver

import (
	"errors"
	"fmt"
	"io/fs"
	"log/slog"

	"plinth.dev/plinth/roleserver/identity"
	"plinth.dev/plinth/roleserver/localstorage"
)

// The cluster CRL on a node: the curator leader hands the newest one out
// with heartbeat answers; the node checks it in every TLS handshake
// (creds.Trust is shared by the NodeManagement server, the curator
// connection and, on consensus members, the local curator) and keeps it
// on /data, so that a revoked certificate stays refused from the first
// handshake after a reboot, before any curator was asked.

// restoreCRL loads the CRL kept on /data into trust. A missing file is
// fine (a new node); a damaged or foreign one is logged and ignored: the
// next heartbeat brings the current CRL.
func (s *Service) restoreCRL(trust *identity.Trust, log *slog.Logger) {
	if s.StorageRoot == nil || trust == nil {
		return
	}
	b, err := s.StorageRoot.Data.Node.ClusterCRL.Read()
	if errors.Is(err, fs.ErrNotExist) {
		return
	}
	if err == nil {
		_, err = trust.SetCRL(b)
	}
	if err != nil && !errors.Is(err, identity.ErrStaleCRL) && log != nil {
		log.Warn("cluster CRL on disk unusable; waiting for the curator's", "err", err)
	}
}

// acceptCRL installs a CRL from the curator leader and keeps it on /data.
// A CRL that is not newer than the one held changes nothing.
func (s *Service) acceptCRL(trust *identity.Trust, der []byte, log *slog.Logger) error {
	crl, err := trust.SetCRL(der)
	if errors.Is(err, identity.ErrStaleCRL) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("cluster CRL from the curator refused: %w", err)
	}
	log.Info("cluster CRL updated", "number", crl.List.Number.String(), "revoked", len(crl.List.RevokedCertificateEntries))
	if err := localstorage.Create(&s.StorageRoot.Data.Node, 0o700); err != nil {
		return err
	}
	return s.StorageRoot.Data.Node.ClusterCRL.Write(der, 0o600)
}
