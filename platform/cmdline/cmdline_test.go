package cmdline

import "testing"

func TestParse(t *testing.T) {
	m := Parse(`console=ttyS0 quiet  plinth.verity=v1,a "x=a b" k=1 k=2` + "\n")
	want := map[string]string{"console": "ttyS0", "quiet": "", "plinth.verity": "v1,a", "x": "a b", "k": "2"}
	if len(m) != len(want) {
		t.Fatalf("got %v", m)
	}
	for k, v := range want {
		if got, ok := m[k]; !ok || got != v {
			t.Errorf("%s = %q, want %q", k, got, v)
		}
	}
}
