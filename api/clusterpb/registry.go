package clusterpb

import (
	"crypto/x509"
	"encoding/pem"
	"fmt"
	"net"
	"net/url"
	"strconv"
	"strings"
)

// Check reports what is wrong with an image registry's entry: a host
// that is not a host name or address (with an optional port) as image
// references write it, a mirror that is not an http(s) URL of a host,
// CA certificates that are not PEM certificates, or credentials that are
// half given or cannot be sent as HTTP basic authentication. Nodes write
// containerd's and the kubelet's configuration from the entry, so the
// curator refuses a bad one before storing it.
func (r *ImageRegistry) Check() error {
	h := r.GetHost()
	if err := checkRegistryHost(h); err != nil {
		return fmt.Errorf("image registry %q: %w", h, err)
	}
	for _, m := range r.GetMirrors() {
		if err := checkMirror(m); err != nil {
			return fmt.Errorf("image registry %s: mirror %q: %w", h, m, err)
		}
	}
	if c := r.GetCaCertificates(); c != "" {
		if _, err := ParseCertificatesPEM([]byte(c)); err != nil {
			return fmt.Errorf("image registry %s: CA certificates: %w", h, err)
		}
	}
	u, p := r.GetUsername(), r.GetPassword()
	switch {
	case (u == "") != (p == ""):
		return fmt.Errorf("image registry %s: give both a username and a password, or neither", h)
	case strings.Contains(u, ":"):
		return fmt.Errorf("image registry %s: a username cannot contain ':' (HTTP basic authentication)", h)
	case strings.ContainsFunc(u+p, isControl):
		return fmt.Errorf("image registry %s: the credentials contain a control character", h)
	}
	return nil
}

// Redacted is the entry with its password replaced by "(set)", for
// printing.
func (r *ImageRegistry) Redacted() *ImageRegistry {
	out := &ImageRegistry{Host: r.GetHost(), Mirrors: r.GetMirrors(), CaCertificates: r.GetCaCertificates(), Username: r.GetUsername()}
	if r.GetPassword() != "" {
		out.Password = "(set)"
	}
	return out
}

func isControl(c rune) bool { return c < 0x20 || c == 0x7f }

// checkRegistryHost accepts a DNS name or an IP address (IPv6 in
// brackets), with an optional port, lower case: the registry part of an
// image reference, which is also the name of its directory in
// containerd's hosts configuration.
func checkRegistryHost(h string) error {
	if h == "" {
		return fmt.Errorf("no host")
	}
	if strings.ToLower(h) != h {
		return fmt.Errorf("write the host in lower case, as image references do")
	}
	host, port, hasPort, bracketed := h, "", false, strings.HasPrefix(h, "[")
	if bracketed {
		end := strings.Index(h, "]")
		if end < 0 {
			return fmt.Errorf("unclosed '['")
		}
		host = h[1:end]
		switch rest := h[end+1:]; {
		case rest == "":
		case strings.HasPrefix(rest, ":"):
			port, hasPort = rest[1:], true
		default:
			return fmt.Errorf("want [address] or [address]:port")
		}
	} else if i := strings.LastIndex(h, ":"); i >= 0 {
		host, port, hasPort = h[:i], h[i+1:], true
	}
	if hasPort {
		if n, err := strconv.Atoi(port); err != nil || n < 1 || n > 65535 || strconv.Itoa(n) != port {
			return fmt.Errorf("port %q: want 1 to 65535", port)
		}
	}
	if ip := net.ParseIP(host); ip != nil {
		if (ip.To4() == nil) != bracketed {
			return fmt.Errorf("an IPv6 address goes in brackets, an IPv4 address does not")
		}
		return nil
	}
	if bracketed {
		return fmt.Errorf("%q in brackets is not an IPv6 address", host)
	}
	if len(host) > 253 {
		return fmt.Errorf("host name longer than 253 characters")
	}
	for _, label := range strings.Split(host, ".") {
		if label == "" || len(label) > 63 || label[0] == '-' || label[len(label)-1] == '-' ||
			strings.IndexFunc(label, func(c rune) bool { return !(c >= 'a' && c <= 'z' || c >= '0' && c <= '9' || c == '-') }) >= 0 {
			return fmt.Errorf("%q is not a host name or address (a registry, not a URL: no scheme or path)", host)
		}
	}
	return nil
}

// checkMirror accepts an http or https URL of a host (with an optional
// port and path), nothing else.
func checkMirror(m string) error {
	u, err := url.Parse(m)
	if err != nil {
		return err
	}
	switch {
	case u.Scheme != "https" && u.Scheme != "http":
		return fmt.Errorf("want an https:// (or http://) URL")
	case u.Host == "":
		return fmt.Errorf("no host")
	case u.User != nil:
		return fmt.Errorf("no credentials in the URL: give them with the registry")
	case u.RawQuery != "" || u.Fragment != "" || u.Opaque != "":
		return fmt.Errorf("no query or fragment")
	case strings.ContainsAny(m, "\"\\\n") || strings.ContainsFunc(m, isControl):
		return fmt.Errorf("quotes, backslashes and control characters are not allowed")
	}
	return checkRegistryHost(strings.ToLower(u.Host))
}

// ParseCertificatesPEM parses one or more PEM certificates and nothing
// else (no keys, no stray text between blocks).
func ParseCertificatesPEM(b []byte) ([]*x509.Certificate, error) {
	var certs []*x509.Certificate
	rest := b
	for {
		var block *pem.Block
		block, rest = pem.Decode(rest)
		if block == nil {
			break
		}
		if block.Type != "CERTIFICATE" {
			return nil, fmt.Errorf("a PEM block of type %q, want CERTIFICATE", block.Type)
		}
		c, err := x509.ParseCertificate(block.Bytes)
		if err != nil {
			return nil, err
		}
		certs = append(certs, c)
	}
	if len(strings.TrimSpace(string(rest))) > 0 {
		return nil, fmt.Errorf("text that is not a PEM certificate")
	}
	if len(certs) == 0 {
		return nil, fmt.Errorf("no PEM certificate")
	}
	return certs, nil
}
