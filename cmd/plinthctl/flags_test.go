package main

import (
	"slices"
	"testing"
)

func TestListFlag(t *testing.T) {
	var l listFlag
	for _, v := range []string{"a:1", " b:2 , c:3,", ""} {
		if err := l.Set(v); err != nil {
			t.Fatal(err)
		}
	}
	if !slices.Equal(l, listFlag{"a:1", "b:2", "c:3"}) || l.String() != "a:1,b:2,c:3" {
		t.Errorf("listFlag %q", l)
	}
}
