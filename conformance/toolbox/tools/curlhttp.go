package tools

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"maps"
	"net"
	"net/http"
	"net/http/httptrace"
	"net/url"
	"os"
	"slices"
	"strconv"
	"strings"
	"time"
)

// curlFetch does curl's transfer: the request, the response written to
// stdout or -o's file, and the error mapped to curl's exit code.
func curlFetch(o *curlOpts, raw string, stdin io.Reader, stdout, stderr io.Writer,
	vars map[string]string, received *int64) *curlError {
	u, cerr := curlURL(raw)
	if cerr != nil {
		return cerr
	}
	vars["url_effective"] = u.String()
	ctx := context.Background()
	if o.maxTime > 0 {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, o.maxTime)
		defer cancel()
	}
	start := time.Now()
	elapsed := func() int64 { return time.Since(start).Milliseconds() }

	dialer := &net.Dialer{Timeout: o.connectTimeout}
	if o.iface != "" {
		ip, err := curlInterfaceIP(o.iface)
		if err != nil {
			return &curlError{45, fmt.Sprintf("Couldn't bind to '%s'", o.iface)}
		}
		dialer.LocalAddr = &net.TCPAddr{IP: ip}
	}
	tr := &http.Transport{
		// curl's defaults: no connection reuse, no transparent gzip, and
		// plain HTTP/1.1 (Go skips HTTP/2 with a custom dialer anyway).
		// No proxy either: Proxy is nil, the test pods have none.
		DisableKeepAlives:   true,
		DisableCompression:  true,
		TLSClientConfig:     &tls.Config{InsecureSkipVerify: o.insecure},
		TLSHandshakeTimeout: o.connectTimeout,
		DialContext: func(ctx context.Context, network, addr string) (net.Conn, error) {
			c, err := dialer.DialContext(ctx, network, addr)
			if err != nil {
				return nil, &connectError{err}
			}
			return c, nil
		},
	}
	defer tr.CloseIdleConnections()
	client := &http.Client{
		Transport:     tr,
		CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse },
	}
	// The transport dials in a goroutine of its own, which a timeout can
	// leave behind; GotConn runs in this one.
	ctx = httptrace.WithClientTrace(ctx, &httptrace.ClientTrace{GotConn: func(info httptrace.GotConnInfo) {
		if ra, ok := info.Conn.RemoteAddr().(*net.TCPAddr); ok {
			vars["remote_ip"], vars["remote_port"] = ra.IP.String(), strconv.Itoa(ra.Port)
			if o.verbose {
				fmt.Fprintf(stderr, "* Connected to %s (%s) port %d\n", u.Hostname(), ra.IP, ra.Port)
			}
		}
	}})
	req, cerr := curlRequest(ctx, o, u, stdin)
	if cerr != nil {
		return cerr
	}
	if o.verbose {
		curlVerboseRequest(stderr, req)
	}
	resp, err := client.Do(req)
	if err != nil {
		return curlClassify(err, u, elapsed(), 0)
	}
	defer resp.Body.Close()
	vars["http_code"] = fmt.Sprintf("%03d", resp.StatusCode)
	vars["content_type"] = resp.Header.Get("Content-Type")
	head := curlResponseHead(resp)
	if o.verbose {
		for _, line := range strings.Split(strings.TrimSuffix(head, "\r\n"), "\r\n") {
			fmt.Fprintf(stderr, "< %s\n", line)
		}
	}
	if o.fail && resp.StatusCode >= 400 {
		return &curlError{22, fmt.Sprintf("The requested URL returned error: %d", resp.StatusCode)}
	}
	out := stdout
	if o.output != "" {
		f, err := os.Create(o.output)
		if err != nil {
			return &curlError{23, "Failure writing output to destination"}
		}
		defer f.Close()
		out = f
	}
	if o.include {
		if _, err := io.WriteString(out, head); err != nil {
			return &curlError{23, "Failure writing output to destination"}
		}
	}
	n, err := io.Copy(errWriter{out}, resp.Body)
	*received = n
	if err != nil {
		var we *writeError
		if errors.As(err, &we) {
			return &curlError{23, "Failure writing output to destination"}
		}
		return curlClassify(err, u, elapsed(), n)
	}
	return nil
}

// connectError marks an error from the dial, which curl reports apart
// from errors later in the transfer.
type connectError struct{ err error }

func (e *connectError) Error() string { return e.err.Error() }
func (e *connectError) Unwrap() error { return e.err }

// writeError marks a failure to write the output (curl's exit 23), which
// io.Copy would not tell apart from a failure to read the body.
type writeError struct{ error }

type errWriter struct{ w io.Writer }

func (e errWriter) Write(p []byte) (int, error) {
	n, err := e.w.Write(p)
	if err != nil {
		err = &writeError{err}
	}
	return n, err
}

// curlURL makes a URL of curl's argument: http:// when there is no scheme.
func curlURL(raw string) (*url.URL, *curlError) {
	s := raw
	if !strings.Contains(s, "://") {
		s = "http://" + s
	}
	u, err := url.Parse(s)
	if err != nil || u.Host == "" || u.Hostname() == "" {
		return nil, &curlError{3, "URL rejected: Malformed input to a URL function"}
	}
	u.Scheme = strings.ToLower(u.Scheme)
	if u.Scheme != "http" && u.Scheme != "https" {
		return nil, &curlError{1, fmt.Sprintf("Protocol %q not supported", u.Scheme)}
	}
	if u.Path == "" {
		u.Path = "/"
	}
	return u, nil
}

// curlInterfaceIP takes --interface as curl does: an address or the name
// of a network interface (its first address).
func curlInterfaceIP(s string) (net.IP, error) {
	if ip := net.ParseIP(s); ip != nil {
		return ip, nil
	}
	ifi, err := net.InterfaceByName(s)
	if err != nil {
		return nil, err
	}
	addrs, err := ifi.Addrs()
	if err != nil || len(addrs) == 0 {
		return nil, errors.New("no address")
	}
	ipn, ok := addrs[0].(*net.IPNet)
	if !ok {
		return nil, errors.New("no address")
	}
	return ipn.IP, nil
}

func curlRequest(ctx context.Context, o *curlOpts, u *url.URL, stdin io.Reader) (*http.Request, *curlError) {
	method := o.method
	var body io.Reader
	if o.data != nil {
		parts := make([]string, len(o.data))
		for i, d := range o.data {
			// -d @FILE and -d @- read the data, without line breaks.
			if name, ok := strings.CutPrefix(d, "@"); ok {
				var b []byte
				var err error
				if name == "-" {
					b, err = io.ReadAll(stdin)
				} else {
					b, err = os.ReadFile(name)
				}
				if err != nil {
					return nil, &curlError{26, "Failed to open/read local data"}
				}
				d = strings.NewReplacer("\r", "", "\n", "").Replace(string(b))
			}
			parts[i] = d
		}
		body = strings.NewReader(strings.Join(parts, "&"))
		if method == "" {
			method = http.MethodPost
		}
	}
	if method == "" && o.head {
		method = http.MethodHead
	}
	if method == "" {
		method = http.MethodGet
	}
	req, err := http.NewRequestWithContext(ctx, method, u.String(), body)
	if err != nil {
		return nil, &curlError{3, "URL rejected: Malformed input to a URL function"}
	}
	req.Header.Set("User-Agent", "curl/8.0 (plinth e2etools)")
	req.Header.Set("Accept", "*/*")
	if body != nil {
		req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
	}
	seen := map[string]bool{}
	for _, h := range o.headers {
		k, v, ok := strings.Cut(h, ":")
		if !ok {
			continue
		}
		k, v = http.CanonicalHeaderKey(strings.TrimSpace(k)), strings.TrimSpace(v)
		switch {
		case k == "Host":
			req.Host = v
		case v == "": // curl: "K:" removes a header it would send
			req.Header.Del(k)
		case seen[k]:
			req.Header.Add(k, v)
		default: // the first -H for a header replaces curl's own
			req.Header.Set(k, v)
		}
		seen[k] = true
	}
	return req, nil
}

// curlResponseHead is the status line and headers as -i prints them.
// Go keeps neither the headers' order nor their case: sorted, canonical.
func curlResponseHead(resp *http.Response) string {
	var b strings.Builder
	fmt.Fprintf(&b, "%s %s\r\n", resp.Proto, resp.Status)
	writeHeaders(&b, resp.Header, "", "\r\n")
	if len(resp.TransferEncoding) > 0 {
		fmt.Fprintf(&b, "Transfer-Encoding: %s\r\n", strings.Join(resp.TransferEncoding, ", "))
	}
	b.WriteString("\r\n")
	return b.String()
}

// writeHeaders writes h sorted by name, one "prefix name: value eol"
// line per value.
func writeHeaders(w io.Writer, h http.Header, prefix, eol string) {
	for _, k := range slices.Sorted(maps.Keys(h)) {
		for _, v := range h[k] {
			fmt.Fprintf(w, "%s%s: %s%s", prefix, k, v, eol)
		}
	}
}

func curlVerboseRequest(stderr io.Writer, req *http.Request) {
	host := req.Host
	if host == "" {
		host = req.URL.Host
	}
	fmt.Fprintf(stderr, "> %s %s HTTP/1.1\n> Host: %s\n", req.Method, req.URL.RequestURI(), host)
	writeHeaders(stderr, req.Header, "> ", "\n")
	fmt.Fprintln(stderr, ">")
}

// curlClassify maps a Go error to curl's exit code and message.
func curlClassify(err error, u *url.URL, ms, received int64) *curlError {
	var ce *connectError
	if errors.As(err, &ce) {
		var dnsErr *net.DNSError
		var sysErr *os.SyscallError
		switch {
		case errors.As(err, &dnsErr) && dnsErr.IsTimeout:
			return &curlError{28, fmt.Sprintf("Resolving timed out after %d milliseconds", ms)}
		case errors.As(err, &dnsErr):
			return &curlError{6, "Could not resolve host: " + u.Hostname()}
		case isTimeout(err):
			return &curlError{28, fmt.Sprintf("Connection timed out after %d milliseconds", ms)}
		case errors.As(err, &sysErr) && sysErr.Syscall == "bind":
			return &curlError{45, "bind failed: " + errnoText(err)}
		}
		return &curlError{7, fmt.Sprintf("Failed to connect to %s port %s: %s", u.Hostname(), curlPort(u), errnoText(err))}
	}
	var certErr *tls.CertificateVerificationError
	switch {
	case isTimeout(err):
		return &curlError{28, fmt.Sprintf("Operation timed out after %d milliseconds with %d bytes received", ms, received)}
	case errors.As(err, &certErr):
		return &curlError{60, "SSL certificate problem: " + certErr.Err.Error()}
	case strings.Contains(err.Error(), "tls:"):
		return &curlError{35, "TLS connect error: " + err.Error()}
	case received == 0 && (errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF)):
		return &curlError{52, "Empty reply from server"}
	}
	return &curlError{56, "Failure when receiving data from the peer"}
}

func curlPort(u *url.URL) string {
	if p := u.Port(); p != "" {
		return p
	}
	if u.Scheme == "https" {
		return "443"
	}
	return "80"
}
