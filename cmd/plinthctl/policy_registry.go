package main

import (
	"fmt"
	"io"
	"os"
	"slices"
	"strings"

	"github.com/spf13/pflag"

	"plinth.dev/plinth/api/clusterpb"
)

// registryFlags are cluster policy's flags for one image registry:
// --registry names it (a new entry, or the one the policy has), the
// others replace its parts; --remove-registry drops entries.
type registryFlags struct {
	host          string
	mirrors       listFlag
	noMirrors     bool
	ca            string
	noCA          bool
	username      string
	passwordFile  string
	noCredentials bool
	remove        listFlag
}

// entryFlags are the flags that change the --registry entry.
var entryFlags = []string{"mirror", "no-mirrors", "registry-ca", "no-registry-ca", "registry-username", "registry-password-file", "no-registry-credentials"}

func (r *registryFlags) define(fs *pflag.FlagSet) {
	fs.StringVar(&r.host, "registry", "", "image registry `host` (as image references name it, e.g. registry.example.com or 10.0.0.5:5000) the flags below set up; added if the policy has none")
	fs.Var(&r.mirrors, "mirror", "mirror `URL` (https://host[:port]) tried before the registry, in the order given (repeat; replaces the list)")
	fs.BoolVar(&r.noMirrors, "no-mirrors", false, "pull from the registry itself only")
	fs.StringVar(&r.ca, "registry-ca", "", "PEM `file` of CA certificates the registry and its mirrors are checked against, besides the system's")
	fs.BoolVar(&r.noCA, "no-registry-ca", false, "the system's CAs only")
	fs.StringVar(&r.username, "registry-username", "", "`name` for pulls from the registry (with --registry-password-file)")
	fs.StringVar(&r.passwordFile, "registry-password-file", "", "`file` holding the password (its first line; - for standard input)")
	fs.BoolVar(&r.noCredentials, "no-registry-credentials", false, "pull from the registry anonymously")
	fs.Var(&r.remove, "remove-registry", "image registry `host` to drop from the policy (repeat)")
}

// given reports whether any registry flag was given.
func (r *registryFlags) given(fs *pflag.FlagSet) bool {
	return r.host != "" || len(r.remove) > 0 || slices.ContainsFunc(entryFlags, fs.Changed)
}

// check refuses combinations that say two things (wrong usage), before
// anything is sent.
func (r *registryFlags) check(fs *pflag.FlagSet) error {
	if r.host == "" && slices.ContainsFunc(entryFlags, fs.Changed) {
		return usagef("--mirror, --registry-ca and the credentials flags need --registry HOST")
	}
	switch {
	case len(r.mirrors) > 0 && r.noMirrors:
		return usagef("give --mirror or --no-mirrors, not both")
	case r.ca != "" && r.noCA:
		return usagef("give --registry-ca or --no-registry-ca, not both")
	case (r.username != "" || r.passwordFile != "") && r.noCredentials:
		return usagef("give credentials or --no-registry-credentials, not both")
	case (r.username == "") != (r.passwordFile == ""):
		return usagef("give both --registry-username and --registry-password-file")
	case r.host != "" && slices.Contains(r.remove, r.host):
		return usagef("--registry %s and --remove-registry %s: give one", r.host, r.host)
	}
	return nil
}

// apply changes k's registries as the flags (already checked) say. The
// result is checked here (the curator checks it again) so that a mistake
// says which flag.
func (r *registryFlags) apply(k *clusterpb.KubernetesPolicy) error {
	for _, h := range r.remove {
		i := slices.IndexFunc(k.ImageRegistries, func(e *clusterpb.ImageRegistry) bool { return e.GetHost() == h })
		if i < 0 {
			return fmt.Errorf("--remove-registry %s: the policy has no such registry", h)
		}
		k.ImageRegistries = slices.Delete(k.ImageRegistries, i, i+1)
	}
	if r.host == "" {
		return nil
	}
	i := slices.IndexFunc(k.ImageRegistries, func(e *clusterpb.ImageRegistry) bool { return e.GetHost() == r.host })
	if i < 0 {
		k.ImageRegistries = append(k.ImageRegistries, &clusterpb.ImageRegistry{Host: r.host})
		i = len(k.ImageRegistries) - 1
	}
	e := k.ImageRegistries[i]
	switch {
	case len(r.mirrors) > 0:
		e.Mirrors = r.mirrors
	case r.noMirrors:
		e.Mirrors = nil
	}
	switch {
	case r.ca != "":
		b, err := os.ReadFile(r.ca)
		if err != nil {
			return fmt.Errorf("--registry-ca: %w", err)
		}
		e.CaCertificates = string(b)
	case r.noCA:
		e.CaCertificates = ""
	}
	switch {
	case r.username != "":
		p, err := readPassword(r.passwordFile)
		if err != nil {
			return fmt.Errorf("--registry-password-file: %w", err)
		}
		e.Username, e.Password = r.username, p
	case r.noCredentials:
		e.Username, e.Password = "", ""
	}
	if err := e.Check(); err != nil {
		return err
	}
	return nil
}

// readPassword is the first line of file (- for standard input).
func readPassword(file string) (string, error) {
	var b []byte
	var err error
	if file == "-" {
		b, err = io.ReadAll(os.Stdin)
	} else {
		b, err = os.ReadFile(file)
	}
	if err != nil {
		return "", err
	}
	line, _, _ := strings.Cut(string(b), "\n")
	line = strings.TrimSuffix(line, "\r")
	if line == "" {
		return "", fmt.Errorf("%s: empty", file)
	}
	return line, nil
}

// printRegistries prints the policy's image registries, passwords left
// out.
func printRegistries(w io.Writer, regs []*clusterpb.ImageRegistry) {
	if len(regs) == 0 {
		fmt.Fprintln(w, "image registries:   none configured (pulled from directly, system CAs, anonymously)")
		return
	}
	for i, r := range regs {
		label := "image registries:"
		if i > 0 {
			label = ""
		}
		var parts []string
		if m := r.GetMirrors(); len(m) > 0 {
			parts = append(parts, "mirrors "+strings.Join(m, " "))
		}
		if c := r.GetCaCertificates(); c != "" {
			certs, err := clusterpb.ParseCertificatesPEM([]byte(c))
			if err != nil {
				parts = append(parts, "CA certificates: "+err.Error())
			} else {
				var names []string
				for _, cert := range certs {
					names = append(names, cert.Subject.String())
				}
				parts = append(parts, "CA "+strings.Join(names, "; "))
			}
		}
		if u := r.GetUsername(); u != "" {
			parts = append(parts, "user "+u+" (password set)")
		}
		if len(parts) == 0 {
			parts = append(parts, "as without an entry")
		}
		fmt.Fprintf(w, "%-19s %s: %s\n", label, r.GetHost(), strings.Join(parts, ", "))
	}
}
