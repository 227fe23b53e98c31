package tools

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"net"
	"os"
	"strings"
)

// The files getent reads; variables so tests can use their own. Lookups
// by host name go through Go's resolver, which reads /etc/hosts itself.
var (
	passwdPath = "/etc/passwd"
	groupPath  = "/etc/group"
	hostsPath  = "/etc/hosts"
)

func getentMain(args []string, stdin io.Reader, stdout, stderr io.Writer) int {
	if len(args) < 2 {
		fmt.Fprintln(stderr, "usage: getent hosts|ahosts|ahostsv4|ahostsv6|passwd|group [key ...]")
		return 1
	}
	db, keys := args[1], args[2:]
	switch db {
	case "hosts", "ahosts", "ahostsv4", "ahostsv6":
		if len(keys) == 0 && db == "hosts" {
			return getentHostsFile(stdout)
		}
		if len(keys) == 0 {
			fmt.Fprintf(stderr, "Enumeration not supported on %s\n", db)
			return 3
		}
		return getentHosts(db, keys, stdout)
	case "passwd":
		return getentFile(passwdPath, keys, stdout)
	case "group":
		return getentFile(groupPath, keys, stdout)
	}
	fmt.Fprintf(stderr, "Unknown database: %s\n", db)
	return 1
}

// getentHosts resolves like glibc's getent: the hosts file, then DNS with
// the search list (Go's resolver follows /etc/nsswitch.conf and
// /etc/resolv.conf). glibc prints one address family; this prints every
// address. Exit 2 when a key is not found.
func getentHosts(db string, keys []string, stdout io.Writer) int {
	r := &net.Resolver{PreferGo: true}
	ctx := context.Background()
	code := 0
	for _, key := range keys {
		if ip := net.ParseIP(key); ip != nil && db == "hosts" {
			names, err := r.LookupAddr(ctx, key)
			if err != nil || len(names) == 0 {
				code = 2
				continue
			}
			for i := range names {
				names[i] = strings.TrimSuffix(names[i], ".")
			}
			fmt.Fprintf(stdout, "%-15s %s\n", key, strings.Join(names, " "))
			continue
		}
		addrs, err := r.LookupIPAddr(ctx, key)
		found := false
		for _, a := range addrs {
			v4 := a.IP.To4() != nil
			if (db == "ahostsv4" && !v4) || (db == "ahostsv6" && v4) {
				continue
			}
			found = true
			if db == "hosts" {
				fmt.Fprintf(stdout, "%-15s %s\n", a.IP, key)
				continue
			}
			// ahosts lists getaddrinfo's results: one per socket type.
			fmt.Fprintf(stdout, "%-15s %-6s %s\n%-15s %-6s \n%-15s %-6s \n",
				a.IP, "STREAM", key, a.IP, "DGRAM", a.IP, "RAW")
		}
		if err != nil || !found {
			code = 2
		}
	}
	return code
}

// getentHostsFile enumerates the hosts file, as getent hosts without keys.
func getentHostsFile(stdout io.Writer) int {
	f, err := os.Open(hostsPath)
	if err != nil {
		return 0
	}
	defer f.Close()
	s := bufio.NewScanner(f)
	for s.Scan() {
		line, _, _ := strings.Cut(s.Text(), "#")
		if fields := strings.Fields(line); len(fields) >= 2 {
			fmt.Fprintf(stdout, "%-15s %s\n", fields[0], strings.Join(fields[1:], " "))
		}
	}
	return 0
}

// getentFile prints the lines of a passwd or group file: all of them, or
// the first for each key, by name or (a number) by the id in the third
// field. Exit 2 when a key is not found.
func getentFile(path string, keys []string, stdout io.Writer) int {
	var lines []string
	if b, err := os.ReadFile(path); err == nil {
		for _, l := range strings.Split(string(b), "\n") {
			if l != "" && !strings.HasPrefix(l, "#") {
				lines = append(lines, l)
			}
		}
	}
	if len(keys) == 0 {
		for _, l := range lines {
			fmt.Fprintln(stdout, l)
		}
		return 0
	}
	code := 0
	for _, key := range keys {
		field := 0
		if key != "" && strings.Trim(key, "0123456789") == "" {
			field = 2
		}
		found := false
		for _, l := range lines {
			if f := strings.Split(l, ":"); len(f) > field && f[field] == key {
				fmt.Fprintln(stdout, l)
				found = true
				break
			}
		}
		if !found {
			code = 2
		}
	}
	return code
}
