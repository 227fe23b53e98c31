package tools

import (
	"fmt"
	"io"
	"strconv"
	"strings"
	"time"
)

// curlOpts is the subset of curl's options the e2e tests use.
type curlOpts struct {
	silent, showError, include, verbose, insecure, fail, head bool
	output, writeOut, iface, method                           string
	connectTimeout, maxTime                                   time.Duration
	headers, data                                             []string
	urls                                                      []string
}

// Options without and with a value, by short letter and by long name.
var (
	curlShortFlags = map[byte]string{'g': "globoff", 'q': "disable", 's': "silent", 'S': "show-error",
		'i': "include", 'v': "verbose", 'k': "insecure", 'f': "fail", 'I': "head"}
	curlShortValues = map[byte]string{'o': "output", 'w': "write-out", 'm': "max-time",
		'X': "request", 'H': "header", 'd': "data"}
	curlLongValues = map[string]bool{"output": true, "write-out": true, "max-time": true, "request": true,
		"header": true, "data": true, "connect-timeout": true, "interface": true}
)

// curlError is an error with curl's exit code and message.
type curlError struct {
	code int
	msg  string
}

func curlMain(args []string, stdin io.Reader, stdout, stderr io.Writer) int {
	o, err := parseCurlArgs(args[1:])
	if err != nil {
		fmt.Fprintf(stderr, "curl: %v\n", err)
		return 2
	}
	if len(o.urls) == 0 {
		fmt.Fprintln(stderr, "curl: no URL specified")
		return 2
	}
	code := 0
	for _, raw := range o.urls {
		code = curlOne(o, raw, stdin, stdout, stderr)
	}
	return code
}

func parseCurlArgs(args []string) (*curlOpts, error) {
	o := &curlOpts{}
	for i := 0; i < len(args); i++ {
		a := args[i]
		value := func(name string) (string, error) {
			if i+1 >= len(args) {
				return "", fmt.Errorf("option %s: requires parameter", name)
			}
			i++
			return args[i], nil
		}
		switch {
		case a == "--":
			o.urls = append(o.urls, args[i+1:]...)
			return o, nil
		case strings.HasPrefix(a, "--"):
			name := a[2:]
			v := ""
			if curlLongValues[name] {
				var err error
				if v, err = value(a); err != nil {
					return nil, err
				}
			} else if !curlIsFlag(name) {
				return nil, fmt.Errorf("unsupported option %s", a)
			}
			if err := o.set(name, v); err != nil {
				return nil, err
			}
		case len(a) > 1 && a[0] == '-':
			// Combined short options (-sSk), a value joined (-XPOST) or next.
			for j := 1; j < len(a); j++ {
				if name, ok := curlShortFlags[a[j]]; ok {
					if err := o.set(name, ""); err != nil {
						return nil, err
					}
					continue
				}
				name, ok := curlShortValues[a[j]]
				if !ok {
					return nil, fmt.Errorf("unsupported option -%c", a[j])
				}
				v := a[j+1:]
				if v == "" {
					var err error
					if v, err = value("-" + string(a[j])); err != nil {
						return nil, err
					}
				}
				if err := o.set(name, v); err != nil {
					return nil, err
				}
				break
			}
		default:
			o.urls = append(o.urls, a)
		}
	}
	return o, nil
}

func curlIsFlag(name string) bool {
	for _, n := range curlShortFlags {
		if n == name {
			return true
		}
	}
	return false
}

func (o *curlOpts) set(name, v string) error {
	var err error
	switch name {
	case "globoff", "disable": // curl's URL globbing and .curlrc: neither exists here
	case "silent":
		o.silent = true
	case "show-error":
		o.showError = true
	case "include":
		o.include = true
	case "verbose":
		o.verbose = true
	case "insecure":
		o.insecure = true
	case "fail":
		o.fail = true
	case "head":
		o.head, o.include = true, true
	case "output":
		o.output = v
	case "write-out":
		o.writeOut = v
	case "interface":
		o.iface = v
	case "request":
		o.method = v
	case "header":
		o.headers = append(o.headers, v)
	case "data":
		o.data = append(o.data, v)
	case "connect-timeout":
		o.connectTimeout, err = parseSeconds(v)
	case "max-time":
		o.maxTime, err = parseSeconds(v)
	}
	if err != nil {
		return fmt.Errorf("option --%s: expected a proper numerical parameter", name)
	}
	return nil
}

// curlOne fetches one URL and writes what curl would: the response (or
// nothing), the -w text, and unless silenced the error message.
func curlOne(o *curlOpts, raw string, stdin io.Reader, stdout, stderr io.Writer) int {
	start := time.Now()
	vars := map[string]string{"http_code": "000", "url_effective": raw}
	var received int64
	cerr := curlFetch(o, raw, stdin, stdout, stderr, vars, &received)
	code := 0
	if cerr != nil {
		code = cerr.code
	}
	vars["response_code"] = vars["http_code"]
	vars["exitcode"] = strconv.Itoa(code)
	vars["size_download"] = strconv.FormatInt(received, 10)
	vars["time_total"] = fmt.Sprintf("%.6f", time.Since(start).Seconds())
	if o.writeOut != "" {
		io.WriteString(stdout, curlWriteOut(o.writeOut, vars))
	}
	if cerr != nil && (!o.silent || o.showError) {
		fmt.Fprintf(stderr, "curl: (%d) %s\n", cerr.code, cerr.msg)
	}
	return code
}

// curlWriteOut expands -w: %{variable}, %% and the escapes \n \r \t \\.
// Unknown variables expand to nothing.
func curlWriteOut(format string, vars map[string]string) string {
	var b strings.Builder
	for i := 0; i < len(format); i++ {
		c := format[i]
		switch {
		case c == '%' && strings.HasPrefix(format[i:], "%%"):
			b.WriteByte('%')
			i++
		case c == '%' && strings.HasPrefix(format[i:], "%{") && strings.IndexByte(format[i:], '}') > 0:
			end := strings.IndexByte(format[i:], '}')
			b.WriteString(vars[format[i+2:i+end]])
			i += end
		case c == '\\' && i+1 < len(format) && strings.IndexByte(`nrt\`, format[i+1]) >= 0:
			b.WriteByte(map[byte]byte{'n': '\n', 'r': '\r', 't': '\t', '\\': '\\'}[format[i+1]])
			i++
		default:
			b.WriteByte(c)
		}
	}
	return b.String()
}
