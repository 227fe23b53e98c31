package kubernetes

import (
	"context"
	"errors"
	"io"
	"net"
	"strconv"
	"sync"
	"time"

	"plinth.dev/plinth/platform/event"
	"plinth.dev/plinth/platform/layout"
	"plinth.dev/plinth/platform/supervisor"
)

// apiProxy is the worker's way to the API servers: a TCP load balancer on
// 127.0.0.1:KubernetesAPIProxyPort that forwards each connection to one of
// the controllers the curator lists, trying the next when one does not
// answer. TLS passes through untouched (the API server's certificate has
// 127.0.0.1 in its names), so the kubelet and the other components need
// one fixed address however the controllers change.
type apiProxy struct {
	// servers are the API servers (host:port), from the curator.
	servers event.Value[[]string]
	listen  string // default 127.0.0.1:KubernetesAPIProxyPort

	mu   sync.Mutex
	list []string
	next int
}

func (p *apiProxy) run(ctx context.Context) error {
	log := supervisor.Logger(ctx)
	addr := p.listen
	if addr == "" {
		addr = net.JoinHostPort("127.0.0.1", strconv.Itoa(layout.KubernetesAPIProxyPort))
	}
	lis, err := net.Listen("tcp", addr)
	if err != nil {
		return err
	}
	defer lis.Close()
	w := p.servers.Watch()
	defer w.Close()
	go func() {
		for {
			list, err := w.Get(ctx)
			if err != nil {
				return
			}
			p.mu.Lock()
			p.list = append([]string(nil), list...)
			p.mu.Unlock()
			log.Info("API servers", "servers", list)
		}
	}()
	go func() {
		<-ctx.Done()
		lis.Close()
	}()
	supervisor.Signal(ctx, supervisor.SignalHealthy)
	for {
		c, err := lis.Accept()
		if err != nil {
			if ctx.Err() != nil {
				return ctx.Err()
			}
			return err
		}
		go p.serve(ctx, c)
	}
}

// errNoAPIServer: no controller is known or none answered.
var errNoAPIServer = errors.New("no Kubernetes API server reachable")

func (p *apiProxy) dial(ctx context.Context) (net.Conn, error) {
	p.mu.Lock()
	list, start := append([]string(nil), p.list...), p.next
	p.next++
	p.mu.Unlock()
	d := net.Dialer{Timeout: 3 * time.Second, KeepAlive: 15 * time.Second}
	for i := range list {
		c, err := d.DialContext(ctx, "tcp", list[(start+i)%len(list)])
		if err == nil {
			return c, nil
		}
	}
	return nil, errNoAPIServer
}

func (p *apiProxy) serve(ctx context.Context, c net.Conn) {
	defer c.Close()
	up, err := p.dial(ctx)
	if err != nil {
		return
	}
	defer up.Close()
	done := make(chan struct{}, 2)
	pipe := func(dst, src net.Conn) {
		_, _ = io.Copy(dst, src)
		if t, ok := dst.(*net.TCPConn); ok {
			_ = t.CloseWrite()
		}
		done <- struct{}{}
	}
	go pipe(up, c)
	go pipe(c, up)
	select {
	case <-done:
		<-done
	case <-ctx.Done():
	}
}
