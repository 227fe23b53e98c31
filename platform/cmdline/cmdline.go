// Package cmdline parses the kernel command line.
package cmdline

import (
	"os"
	"strings"
)

// Parse splits a command line into key → value ("" for bare flags); later
// occurrences win. Double quotes group words, as the kernel does.
func Parse(s string) map[string]string {
	out := map[string]string{}
	var fields []string
	var cur strings.Builder
	quoted := false
	for _, r := range s {
		switch {
		case r == '"':
			quoted = !quoted
		case (r == ' ' || r == '\n' || r == '\t') && !quoted:
			if cur.Len() > 0 {
				fields = append(fields, cur.String())
				cur.Reset()
			}
		default:
			cur.WriteRune(r)
		}
	}
	if cur.Len() > 0 {
		fields = append(fields, cur.String())
	}
	for _, f := range fields {
		k, v, _ := strings.Cut(f, "=")
		out[k] = v
	}
	return out
}

// Read parses /proc/cmdline.
func Read() (map[string]string, error) {
	b, err := os.ReadFile("/proc/cmdline")
	if err != nil {
		return nil, err
	}
	return Parse(string(b)), nil
}
