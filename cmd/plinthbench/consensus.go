package main

import (
	"bufio"
	"bytes"
	"fmt"
	"os/exec"
	"regexp"
	"strconv"
	"strings"
)

var goBenchRE = regexp.MustCompile(`^Benchmark(\w+?)(-\d+)?\s+\d+\s+([\d.]+) ns/op`)

// benchConsensus runs the consensus package's Go benchmarks (in-process
// etcd members on loopback) and reports each, plus the cost of the
// namespaced client against a raw one.
func benchConsensus(add func(name string, v float64, unit, note string)) error {
	cmd := exec.Command("go", "test", "-run", "^$", "-bench", ".", "-benchtime", "5x", "./roleserver/consensus/")
	out, err := cmd.CombinedOutput()
	if err != nil {
		return fmt.Errorf("go test -bench: %v\n%s", err, out)
	}
	ns := map[string]float64{}
	s := bufio.NewScanner(bytes.NewReader(out))
	for s.Scan() {
		m := goBenchRE.FindStringSubmatch(strings.TrimSpace(s.Text()))
		if m == nil {
			continue
		}
		v, _ := strconv.ParseFloat(m[3], 64)
		ns[m[1]] = v
		add("consensus_"+strings.ToLower(m[1])+"_ms", v/1e6, "ms", "go test -bench, 5 iterations")
	}
	if len(ns) == 0 {
		return fmt.Errorf("no benchmark results in:\n%s", out)
	}
	if n, r := ns["PutNamespaced"], ns["PutRaw"]; n > 0 && r > 0 {
		add("consensus_put_namespaced_ratio", n/r, "x", "namespaced client / raw client, same cluster")
	}
	return nil
}
