//go:build built

package vmtest

import (
	"os"
	"testing"

	"plinth.dev/plinth/launch"
)

func TestMain(m *testing.M) {
	launch.MaybeProxy()
	os.Exit(m.Run())
}
