package console

import (
	"slices"
	"testing"
)

func TestOthers(t *testing.T) {
	for _, c := range []struct {
		active string
		want   []string
	}{
		{"", nil},
		{"ttyS0\n", nil},
		{"ttyS0 tty0\n", []string{"/dev/ttyS0"}},
		{"tty1 ttyS0 ttyS1\n", []string{"/dev/tty1", "/dev/ttyS0"}},
		// /dev/console's device named twice, odd names: left out
		{"tty0 ../x ttyS0 tty0\n", []string{"/dev/ttyS0"}},
	} {
		if got := Others(c.active); !slices.Equal(got, c.want) {
			t.Errorf("Others(%q) = %q, want %q", c.active, got, c.want)
		}
	}
}
