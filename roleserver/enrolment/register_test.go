package enrolment

import (
	"testing"

	"plinth.dev/plinth/api/clusterpb"
	"plinth.dev/plinth/platform/storage"
)

// TestStorageSecurity: a registering node reports its data partition's
// protection as the cluster policy names it (checked by the curator
// against minimum_storage_security), and an unknown mode as unspecified.
func TestStorageSecurity(t *testing.T) {
	for mode, want := range map[storage.Mode]clusterpb.StorageSecurity{
		storage.ModeCrypt:         clusterpb.StorageSecurity_STORAGE_SECURITY_ENCRYPTED,
		storage.ModeAuthenticated: clusterpb.StorageSecurity_STORAGE_SECURITY_AUTHENTICATED,
		storage.Mode(0):           clusterpb.StorageSecurity_STORAGE_SECURITY_UNSPECIFIED,
	} {
		if got := storageSecurity(mode); got != want {
			t.Errorf("%v: %v, want %v", mode, got, want)
		}
	}
}
