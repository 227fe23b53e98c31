//go:build built

package vmtest

import (
	"os"
	"testing"
)

func TestMain(m *testing.M) {
	MaybeProxy()
	os.Exit(m.Run())
}
