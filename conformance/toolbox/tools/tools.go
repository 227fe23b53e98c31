// Package tools are the userland tools of e2etools (conformance/toolbox:
// see its package comment): curl, nc, dig and getent, each a function
// taking os.Args-like arguments and the standard streams, so tests call
// them directly. The programs linked in whole (etcd, the sample API
// server) are the command's own, which keeps this package's tests (make
// unit) from compiling them.
package tools

import (
	"errors"
	"fmt"
	"io"
	"maps"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"syscall"
	"time"
)

// selfName is the binary's own name; invoked as that, the tool is the
// first argument (e2etools curl -s ...), otherwise the link's name is.
const selfName = "e2etools"

// Func is every tool's entry point: args as os.Args (args[0] is the
// tool's name), and the standard streams passed in so tests can call the
// tools directly.
type Func func(args []string, stdin io.Reader, stdout, stderr io.Writer) int

var builtin = map[string]Func{
	"curl":   curlMain,
	"nc":     ncMain,
	"dig":    digMain,
	"getent": getentMain,
}

// Main runs the tool args name (os.Args), one of this package's or of
// extra (the command's own).
func Main(args []string, extra map[string]Func, stdin io.Reader, stdout, stderr io.Writer) int {
	tools := maps.Clone(builtin)
	maps.Copy(tools, extra)
	return dispatch(tools, args, stdin, stdout, stderr)
}

func dispatch(tools map[string]Func, args []string, stdin io.Reader, stdout, stderr io.Writer) int {
	if len(args) == 0 {
		return usage(tools, stderr)
	}
	if filepath.Base(args[0]) == selfName {
		args = args[1:]
		if len(args) == 0 {
			return usage(tools, stderr)
		}
	}
	run, ok := tools[filepath.Base(args[0])]
	if !ok {
		fmt.Fprintf(stderr, "%s: unknown tool %q\n", selfName, args[0])
		return usage(tools, stderr)
	}
	return run(args, stdin, stdout, stderr)
}

func usage(tools map[string]Func, stderr io.Writer) int {
	names := make([]string, 0, len(tools))
	for name := range tools {
		names = append(names, name)
	}
	sort.Strings(names)
	fmt.Fprintf(stderr, "usage: %s TOOL [ARGS...], or run through a link named TOOL\ntools: %s\n",
		selfName, strings.Join(names, " "))
	return 2
}

// parseSeconds parses a count of seconds as curl, nc and dig take them
// (fractions allowed, as curl's --connect-timeout 0.5).
func parseSeconds(s string) (time.Duration, error) {
	f, err := strconv.ParseFloat(s, 64)
	if err != nil || f < 0 || f > 1e9 {
		return 0, fmt.Errorf("invalid number of seconds %q", s)
	}
	return time.Duration(f * float64(time.Second)), nil
}

// errnoText is the C library's strerror text for a network error, which
// is what the real tools print and what people grep logs for; Go's own
// messages are lower case and differently worded.
func errnoText(err error) string {
	var errno syscall.Errno
	switch {
	case errors.As(err, &errno):
		s := errno.Error()
		return strings.ToUpper(s[:1]) + s[1:]
	case isTimeout(err):
		return "Connection timed out"
	}
	return err.Error()
}

// isTimeout looks down the whole chain: errors.As would stop at the first
// net.Error, and *url.Error says false when what it wraps is no net.Error.
func isTimeout(err error) bool {
	for ; err != nil; err = errors.Unwrap(err) {
		if t, ok := err.(interface{ Timeout() bool }); ok && t.Timeout() {
			return true
		}
	}
	return false
}
