package main

import (
	"flag"
	"fmt"
	"io"
	"net/http"
	"time"
)

// getCmd is `testpod get URL`: what a test runs inside a pod to reach
// another pod or a Service over the pod network.
func getCmd(args []string, stdout, stderr io.Writer) int {
	fs := flag.NewFlagSet("get", flag.ContinueOnError)
	fs.SetOutput(stderr)
	timeout := fs.Duration("timeout", 10*time.Second, "how long to try")
	if err := fs.Parse(args); err != nil || fs.NArg() != 1 {
		fmt.Fprintln(stderr, "usage: testpod get [-timeout 10s] URL")
		return 2
	}
	client := &http.Client{Timeout: *timeout}
	resp, err := client.Get(fs.Arg(0))
	if err != nil {
		fmt.Fprintln(stderr, "get:", err)
		return 1
	}
	defer resp.Body.Close()
	if _, err := io.Copy(stdout, resp.Body); err != nil {
		fmt.Fprintln(stderr, "get:", err)
		return 1
	}
	if resp.StatusCode != http.StatusOK {
		fmt.Fprintln(stderr, "get:", resp.Status)
		return 1
	}
	return 0
}
