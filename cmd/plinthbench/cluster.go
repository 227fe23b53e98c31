package main

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"time"

	"plinth.dev/plinth/launch"
)

// Console lines the cluster section times (guest RFC 3339 timestamp first).
var (
	coreStartRE  = regexp.MustCompile(`^(\S+) I init: Plinth core starting .*uptime=([0-9.]+)s`)
	healthyRE    = regexp.MustCompile(`^(\S+) I \S*rolefetch: node is HEALTHY`)
	registeredRE = regexp.MustCompile(`^(\S+) I \S+: registered: waiting for the owner to approve`)
	approvedRE   = regexp.MustCompile(`^(\S+) I \S+: approved and committed`)
)

// benchCluster launches a one-node cluster and adds a second node
// (launch.LaunchCluster, AddNode). Times come from two places: each
// console line is stamped on the host as it arrives (and carries the
// guest's clock, which gives the guest uptime), and the harness records
// when its GetNodes polls (about every 2 s) saw each step.
func benchCluster(ctx context.Context, img *launch.Image, work string, bare bareBoot, add addFunc) error {
	dir := filepath.Join(work, "cluster")
	cons := &consoleClock{boots: map[string][]*stampedBoot{}}
	c, err := launch.LaunchCluster(ctx, launch.ClusterOptions{
		Nodes: 1, Image: img, Dir: dir, Progress: os.Stderr, Console: cons.writer,
	})
	if err != nil {
		return err
	}
	defer c.Close()
	boot := c.Nodes()[0]
	bt := boot.Times()
	at, up, err := cons.event(boot.Name, healthyRE)
	if err != nil {
		return err
	}
	wall := at.Sub(bt.Launched).Seconds()
	accel := accelName()
	add("cluster_bootstrap_healthy_wall_seconds", wall, "s", accel+", launch to 'rolefetch: node is HEALTHY' on the console")
	add("cluster_bootstrap_healthy_guest_seconds", up, "s", "guest uptime at that line")
	add("cluster_bootstrap_healthy_polled_seconds", bt.Healthy.Sub(bt.Launched).Seconds(), "s", "launch to UP and HEALTHY in GetNodes (owner client, after takeownership)")
	add("cluster_bootstrap_ratio_wall", wall/bare.wall, "x", "bootstrap HEALTHY / bare init, wall")
	add("cluster_bootstrap_ratio_guest", up/bare.guest, "x", "bootstrap HEALTHY / bare init, guest uptime")

	n, err := c.AddNode(ctx)
	if err != nil {
		return err
	}
	t := n.Times()
	regAt, regUp, err := cons.event(n.Name, registeredRE)
	if err != nil {
		return err
	}
	apprAt, _, err := cons.event(n.Name, approvedRE)
	if err != nil {
		return err
	}
	healthyAt, healthyUp, err := cons.event(n.Name, healthyRE)
	if err != nil {
		return err
	}
	since := func(a, b time.Time) float64 { return a.Sub(b).Seconds() }
	add("cluster_join_registered_wall_seconds", since(regAt, t.Launched), "s", accel+", second node: launch to 'registered: waiting for the owner' on its console")
	add("cluster_join_registered_guest_seconds", regUp, "s", "guest uptime at that line")
	if !t.Approved.IsZero() {
		add("cluster_join_approve_wall_seconds", since(t.Approved, regAt), "s", "that line to the owner's Approve returning (GetNodes poll sees NEW, then Approve)")
		add("cluster_join_approved_seen_wall_seconds", since(apprAt, t.Approved), "s", "Approve returned to 'approved and committed' on the node's console")
		add("cluster_join_approved_to_up_wall_seconds", since(t.Up, t.Approved), "s", "Approve returned to UP in GetNodes (polled)")
		add("cluster_join_approved_to_healthy_wall_seconds", since(healthyAt, t.Approved), "s", "Approve returned to 'node is HEALTHY' on the node's console")
	}
	add("cluster_join_up_wall_seconds", since(t.Up, t.Launched), "s", "launch to UP in GetNodes (polled)")
	add("cluster_join_healthy_wall_seconds", since(healthyAt, t.Launched), "s", "launch to 'node is HEALTHY' on the node's console")
	add("cluster_join_healthy_guest_seconds", healthyUp, "s", "guest uptime at that line")
	add("cluster_join_healthy_polled_seconds", since(t.Healthy, t.Launched), "s", "launch to UP and HEALTHY in GetNodes (polled)")
	return nil
}

// consoleClock stamps every console line of every boot of every node with
// the host time its newline arrived.
type consoleClock struct {
	mu    sync.Mutex
	boots map[string][]*stampedBoot // by node name, in boot order
}

type stampedBoot struct {
	c     *consoleClock
	buf   []byte
	lines []stampedLine
}

type stampedLine struct {
	at   time.Time
	text string
}

// writer is a ClusterOptions.Console: one call per boot.
func (c *consoleClock) writer(name string) io.Writer {
	b := &stampedBoot{c: c}
	c.mu.Lock()
	c.boots[name] = append(c.boots[name], b)
	c.mu.Unlock()
	return b
}

func (b *stampedBoot) Write(p []byte) (int, error) {
	now := time.Now()
	b.c.mu.Lock()
	defer b.c.mu.Unlock()
	b.buf = append(b.buf, p...)
	for {
		i := bytes.IndexByte(b.buf, '\n')
		if i < 0 {
			return len(p), nil
		}
		b.lines = append(b.lines, stampedLine{now, strings.ReplaceAll(string(b.buf[:i]), "\r", "")})
		b.buf = b.buf[i+1:]
	}
}

// event finds the first line of node name's first boot matching re (whose
// first group is the guest's timestamp) and returns when it arrived and
// the guest's uptime then, from the core's start line (which gives the
// uptime at a guest timestamp).
func (c *consoleClock) event(name string, re *regexp.Regexp) (time.Time, float64, error) {
	return c.eventIn(name, 0, re)
}

// eventIn is event in the node's boot'th boot (0 is the first).
func (c *consoleClock) eventIn(name string, boot int, re *regexp.Regexp) (time.Time, float64, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if len(c.boots[name]) <= boot {
		return time.Time{}, 0, fmt.Errorf("%s: no console of boot %d", name, boot+1)
	}
	var base time.Time
	var baseUp float64
	for _, l := range c.boots[name][boot].lines {
		if m := coreStartRE.FindStringSubmatch(l.text); m != nil && base.IsZero() {
			ts, err := time.Parse(time.RFC3339Nano, m[1])
			if err != nil {
				return time.Time{}, 0, fmt.Errorf("%s: core start line %q: %w", name, l.text, err)
			}
			base = ts
			baseUp, _ = strconv.ParseFloat(m[2], 64)
			continue
		}
		m := re.FindStringSubmatch(l.text)
		if m == nil {
			continue
		}
		if base.IsZero() {
			return time.Time{}, 0, fmt.Errorf("%s: %q before the core start line", name, l.text)
		}
		ts, err := time.Parse(time.RFC3339Nano, m[1])
		if err != nil {
			return time.Time{}, 0, fmt.Errorf("%s: %q: %w", name, l.text, err)
		}
		return l.at, baseUp + ts.Sub(base).Seconds(), nil
	}
	return time.Time{}, 0, fmt.Errorf("%s: no console line of its boot %d matches %q", name, boot+1, re)
}
