package roleserver

import (
	"testing"
)

func TestHostsRenderParse(t *testing.T) {
	nodes := map[string]string{"plinth-b": "10.0.0.2", "plinth-a": "10.0.0.1", "plinth-self": "10.9.9.9", "bogus": "not-an-ip"}
	out := string(renderHosts(nodes, "plinth-self", "10.0.0.3"))
	want := hostsHeader + "127.0.0.1\tlocalhost\n::1\tlocalhost\n10.0.0.3\tplinth-self\n10.0.0.1\tplinth-a\n10.0.0.2\tplinth-b\n"
	if out != want {
		t.Fatalf("rendered:\n%s\nwant:\n%s", out, want)
	}
	back := parseHosts([]byte(out))
	if len(back) != 3 || back["plinth-a"] != "10.0.0.1" || back["plinth-self"] != "10.0.0.3" || back["localhost"] != "" {
		t.Errorf("parsed back %v", back)
	}
}
