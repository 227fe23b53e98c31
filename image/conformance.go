package image

import (
	"bytes"
	"fmt"
	"os"
	"path/filepath"
	"strings"

	v1 "github.com/google/go-containerregistry/pkg/v1"

	"plinth.dev/plinth/platform/layout"
	"plinth.dev/plinth/platform/ociarchive"
)

// The images of the upstream Kubernetes conformance tests, without a
// registry (plinthctl build --conformance-images DIR): each under the
// exact reference the suite asks for (e2e.test --list-images), built
// from programs of this module's go.mod and busybox, in one archive
// whose images share their layers:
//
//	busybox    busybox (scripts/busybox: upstream's release from Debian's
//	           source package, static), its applets in /bin (sh is its
//	           ash), /etc/passwd and /etc/group (user 1000 and group
//	           50000, as upstream's agnhost has them), /tmp
//	tools      e2etools (conformance/toolbox, ~7 MB): curl, nc, dig,
//	           getent in /usr/bin
//	servers    e2eservers (conformance/toolbox with tag servers, ~90 MB):
//	           etcd in /usr/local/bin, /sample-apiserver
//	agnhost    agnhost at the nodes' Kubernetes version, /agnhost-2, the
//	           porter's localhost.crt and .key, /uploads
//
//	reference (upstream repository)  layers                     runs
//	e2e-test-images/agnhost          busybox tools agnhost      /agnhost pause
//	e2e-test-images/busybox          busybox                    sh
//	pause                            testpod                    /pause
//	e2e-test-images/nginx            busybox + html             busybox httpd on :80
//	e2e-test-images/glibc-dns-testing busybox tools             sh
//	e2e-test-images/kitten, nautilus agnhost's + jpg, data.json /agnhost test-webserver
//	e2e-test-images/nonewprivs       busybox + setuid nnp       nnp
//	e2e-test-images/nonroot          busybox, user 1234         sh
//	etcd                             busybox tools servers      /usr/local/bin/etcd
//	e2e-test-images/sample-apiserver busybox tools servers      /sample-apiserver
//
// Why substitutes: the nodes have no registry to pull from, and what the
// tests exec in these containers is a handful of tools (a shell, cat,
// nc, curl, dig, getent, mv, …), which a static busybox and a small Go
// program give without a distribution. Only `make conformance` asks for
// them: a normal image stays as small as it was. The servers are a
// program of their own so that the images most specs pull (agnhost and
// the DNS one) do not carry etcd and an API server: under TCG a node
// spends most of a pull hashing, unpacking and writing the layers.

// ConformanceArchive is the archive's file name in layout.ImagesDir, and
// beside the built image (OutDir), which the conformance runner serves
// as a registry.
const ConformanceArchive = "conformance.tar"

// ConformanceInputs are the files the conformance images are made of.
type ConformanceInputs struct {
	// Dir holds what make builds into out/bin/conformance: agnhost,
	// e2etools, e2eservers, nnp and busybox (static executables), localhost.crt and
	// localhost.key (agnhost's porter), kitten/ and nautilus/ (their
	// images' kitten.jpg or nautilus.jpg and data.json).
	Dir string
}

// upstream image registries (the references' first parts).
const (
	e2eImages   = "registry.k8s.io/e2e-test-images/"
	coreImages  = "registry.k8s.io/"
	conformPATH = "PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
)

// ConformanceImages is the table: every reference the images are
// carried under, and what it is built from (the README's table).
var ConformanceImages = []struct{ Ref, From string }{
	{e2eImages + "agnhost:2.66.1", "agnhost (same Kubernetes version), busybox userland, e2etools"},
	{e2eImages + "agnhost:2.55", "the same as agnhost:2.66.1 (the suite's previous agnhost)"},
	{e2eImages + "busybox:1.37.0-2", "busybox (upstream's release, static)"},
	{e2eImages + "busybox:1.36.1-1", "busybox (upstream's release, static)"},
	{coreImages + "pause:3.10.2", "testpod pause (the node's own pause program)"},
	{e2eImages + "nginx:1.27.0-2", "busybox httpd serving /usr/share/nginx/html on :80"},
	{e2eImages + "nginx:1.28.0-2", "busybox httpd serving /usr/share/nginx/html on :80"},
	{e2eImages + "glibc-dns-testing:2.1.1", "busybox, e2etools' dig and getent"},
	{e2eImages + "kitten:1.8", "the agnhost image with upstream's kitten.jpg and data.json"},
	{e2eImages + "nautilus:1.8", "the agnhost image with upstream's nautilus.jpg and data.json"},
	{e2eImages + "nonewprivs:1.4", "busybox, upstream's nnp setuid root"},
	{e2eImages + "nonroot:1.5", "busybox, user 1234"},
	{coreImages + "etcd:3.7.0-0", "e2eservers' etcd (this module's etcd server) as /usr/local/bin/etcd"},
	{e2eImages + "sample-apiserver:1.29.2", "e2eservers' sample-apiserver (k8s.io/sample-apiserver at the nodes' version)"},
}

// busyboxApplets are the applets of busybox linked into /bin, sh among
// them (the binary cannot be run on the build host to list them: it may
// be another architecture). nc is e2etools' (in /usr/bin, ahead in
// PATH): busybox's has no -u, -v or -z. Upstream's defconfig is no
// standalone shell, so sh, env, timeout and xargs find it there.
var busyboxApplets = strings.Fields(`[ [[ ar arch ash awk base64 basename bc blockdev bunzip2 bzcat bzip2 cal cat
	chgrp chmod chown chroot cksum cmp cp cpio crc32 cut date dc dd df diff dirname dmesg dnsdomainname
	dos2unix du echo egrep env expand expr factor fallocate false fgrep find fold free fsync getopt grep groups
	gunzip gzip head hexdump hostid hostname httpd id ip ipcalc kill killall less link ln logname ls lsof md5sum
	mkdir mkfifo mknod mktemp more mount mv netstat nl nohup nproc nslookup od paste patch pidof ping ping6
	printenv printf ps pwd readlink realpath renice rev rm rmdir route sed seq setsid sh sha1sum sha256sum
	sha512sum shuf sleep sort split stat strings stty su sync sysctl tac tail tar tee telnet test time timeout
	top touch tr traceroute true truncate tty umount uname uniq unlink unxz unzip uptime usleep uudecode
	uuencode vi watch wc wget which whoami xargs xxd xz xzcat yes zcat`)

// agnhostOSRelease is the stand-in agnhost's /etc/os-release: it names
// the distribution upstream's image is built on, and says what it is.
const agnhostOSRelease = `NAME="Alpine Linux"
ID=alpine
PRETTY_NAME="Alpine Linux (Plinth's offline stand-in for the upstream image: static busybox and agnhost)"
`

// conformanceFiles returns the archive as a system image file and the
// images it carries.
func conformanceFiles(in ConformanceInputs, testpod []byte, arch string) (sysFile, []ContainerImage, error) {
	var buf bytes.Buffer
	images, err := conformanceImages(in, testpod, arch)
	if err != nil {
		return sysFile{}, nil, err
	}
	if err := writeOCIArchive(&buf, images...); err != nil {
		return sysFile{}, nil, err
	}
	refs, err := ociarchive.Read(bytes.NewReader(buf.Bytes()))
	if err != nil {
		return sysFile{}, nil, err
	}
	archive := filepath.Join(layout.ImagesDir, ConformanceArchive)
	var carried []ContainerImage
	for _, r := range refs {
		carried = append(carried, ContainerImage{Ref: r.Name, Digest: r.Digest, Archive: archive})
	}
	return sysFile{Path: strings.TrimPrefix(archive, "/"), Data: buf.Bytes(), Mode: 0o644}, carried, nil
}

// conformanceImages builds the images of ConformanceImages.
func conformanceImages(in ConformanceInputs, testpod []byte, arch string) ([]containerImage, error) {
	read := func(name string, exec bool) ([]byte, error) {
		p := filepath.Join(in.Dir, name)
		if exec {
			if err := checkStaticExecutable(p, arch); err != nil {
				return nil, fmt.Errorf("conformance images: %w", err)
			}
		}
		b, err := os.ReadFile(p)
		if err != nil {
			return nil, fmt.Errorf("conformance images: %w (make conformance builds %s)", err, in.Dir)
		}
		return b, nil
	}
	files := map[string][]byte{}
	for _, f := range []struct {
		name string
		exec bool
	}{{"agnhost", true}, {"e2etools", true}, {"e2eservers", true}, {"nnp", true}, {"busybox", true}, {"localhost.crt", false}, {"localhost.key", false},
		{"kitten/kitten.jpg", false}, {"kitten/data.json", false}, {"nautilus/nautilus.jpg", false}, {"nautilus/data.json", false}} {
		b, err := read(f.name, f.exec)
		if err != nil {
			return nil, err
		}
		files[f.name] = b
	}
	var layerErr error
	layer := func(entries ...layerEntry) v1.Layer {
		l, err := newLayer(entries)
		if err != nil && layerErr == nil {
			layerErr = err
		}
		return l
	}
	base := []layerEntry{
		{Path: "bin/busybox", Data: files["busybox"]},
		{Path: "etc/passwd", Mode: 0o644, Data: []byte("root:x:0:0:root:/root:/bin/sh\n" +
			"user-defined-in-image:x:1000:1000::/home/user-defined-in-image:/bin/sh\n" +
			"nobody:x:65534:65534:nobody:/nonexistent:/bin/false\n")},
		{Path: "etc/group", Mode: 0o644, Data: []byte("root:x:0:\nuser-defined-in-image:x:1000:\n" +
			"group-defined-in-image:x:50000:user-defined-in-image\nnogroup:x:65534:\n")},
		{Path: "tmp", Dir: true, Mode: 0o1777},
		{Path: "root", Dir: true, Mode: 0o700},
		{Path: "usr/local/bin", Dir: true},
		{Path: "usr/sbin", Dir: true},
		{Path: "sbin", Dir: true},
		{Path: "var/run", Link: "../run"},
		{Path: "run", Dir: true},
	}
	for _, a := range busyboxApplets {
		base = append(base, layerEntry{Path: "bin/" + a, Link: "busybox"})
	}
	bb := layer(base...)
	tools := layer(
		layerEntry{Path: "usr/bin/e2etools", Data: files["e2etools"]},
		layerEntry{Path: "usr/bin/curl", Link: "e2etools"},
		layerEntry{Path: "usr/bin/nc", Link: "e2etools"},
		layerEntry{Path: "usr/bin/dig", Link: "e2etools"},
		layerEntry{Path: "usr/bin/getent", Link: "e2etools"},
	)
	servers := layer(
		layerEntry{Path: "usr/bin/e2eservers", Data: files["e2eservers"]},
		layerEntry{Path: "usr/local/bin/etcd", Link: "../../bin/e2eservers"},
		layerEntry{Path: "sample-apiserver", Link: "usr/bin/e2eservers"},
	)
	agnhost := layer(
		layerEntry{Path: "agnhost", Data: files["agnhost"]},
		layerEntry{Path: "agnhost-2", Link: "agnhost"},
		layerEntry{Path: "localhost.crt", Mode: 0o644, Data: files["localhost.crt"]},
		layerEntry{Path: "localhost.key", Mode: 0o644, Data: files["localhost.key"]},
		layerEntry{Path: "uploads", Dir: true},
		// Upstream's agnhost (and so kitten and nautilus, built on it)
		// is Alpine-based; the ImageVolume spec reads the kitten image's
		// os-release through an image volume and looks for the name.
		layerEntry{Path: "etc/os-release", Mode: 0o644, Data: []byte(agnhostOSRelease)},
	)
	html := []byte("<!DOCTYPE html>\n<html><head><title>Welcome to nginx!</title></head>\n" +
		"<body><h1>Welcome to nginx!</h1><p>(busybox httpd, standing in for nginx offline)</p></body></html>\n")
	nginx := layer(
		layerEntry{Path: "usr/share/nginx/html/index.html", Mode: 0o644, Data: html},
		layerEntry{Path: "usr/share/nginx/html/50x.html", Mode: 0o644, Data: []byte("<html><body>50x</body></html>\n")},
	)
	webData := func(name string) v1.Layer {
		return layer(layerEntry{Path: name + ".jpg", Mode: 0o644, Data: files[name+"/"+name+".jpg"]},
			layerEntry{Path: "data.json", Mode: 0o644, Data: files[name+"/data.json"]})
	}
	kitten, nautilus := webData("kitten"), webData("nautilus")
	nnp := layer(layerEntry{Path: "usr/local/bin/nnp", Mode: 0o4755, Data: files["nnp"]})
	pause := layer(layerEntry{Path: "pause", Data: testpod})
	if layerErr != nil {
		return nil, layerErr
	}

	agnhostImage := func(ref string, extra ...v1.Layer) containerImage {
		return containerImage{Ref: ref, Layers: append([]v1.Layer{bb, tools, agnhost}, extra...),
			Entrypoint: []string{"/agnhost"}, Cmd: []string{"pause"}}
	}
	sh := []string{"sh"}
	nginxCmd := []string{"/bin/busybox", "httpd", "-f", "-p", "80", "-h", "/usr/share/nginx/html"}
	byRef := map[string]containerImage{
		e2eImages + "agnhost:2.66.1":          agnhostImage(e2eImages + "agnhost:2.66.1"),
		e2eImages + "agnhost:2.55":            agnhostImage(e2eImages + "agnhost:2.55"),
		e2eImages + "busybox:1.37.0-2":        {Layers: []v1.Layer{bb}, Cmd: sh},
		e2eImages + "busybox:1.36.1-1":        {Layers: []v1.Layer{bb}, Cmd: sh},
		coreImages + "pause:3.10.2":           {Layers: []v1.Layer{pause}, Entrypoint: []string{"/pause", "pause"}},
		e2eImages + "nginx:1.27.0-2":          {Layers: []v1.Layer{bb, nginx}, Cmd: nginxCmd},
		e2eImages + "nginx:1.28.0-2":          {Layers: []v1.Layer{bb, nginx}, Cmd: nginxCmd},
		e2eImages + "glibc-dns-testing:2.1.1": {Layers: []v1.Layer{bb, tools}, Cmd: sh},
		e2eImages + "kitten:1.8":              {Layers: []v1.Layer{bb, tools, agnhost, kitten}, Entrypoint: []string{"/agnhost"}, Cmd: []string{"test-webserver"}},
		e2eImages + "nautilus:1.8":            {Layers: []v1.Layer{bb, tools, agnhost, nautilus}, Entrypoint: []string{"/agnhost"}, Cmd: []string{"test-webserver"}},
		e2eImages + "nonewprivs:1.4":          {Layers: []v1.Layer{bb, nnp}, Cmd: []string{"nnp"}},
		e2eImages + "nonroot:1.5":             {Layers: []v1.Layer{bb}, Cmd: sh, User: "1234"},
		coreImages + "etcd:3.7.0-0":           {Layers: []v1.Layer{bb, tools, servers}, Cmd: []string{"/usr/local/bin/etcd"}},
		e2eImages + "sample-apiserver:1.29.2": {Layers: []v1.Layer{bb, tools, servers}, Entrypoint: []string{"/sample-apiserver"}},
	}
	var out []containerImage
	for _, c := range ConformanceImages {
		img, ok := byRef[c.Ref]
		if !ok {
			return nil, fmt.Errorf("conformance image %s: in the table but not built", c.Ref)
		}
		img.Ref, img.Arch, img.Env = c.Ref, arch, []string{conformPATH}
		out = append(out, img)
	}
	if len(out) != len(byRef) {
		return nil, fmt.Errorf("conformance images: %d built, %d in the table", len(byRef), len(out))
	}
	return out, nil
}

// ConformanceOCIImages are the conformance images by reference, for
// what serves them from a registry instead of carrying them in a node
// image: the VM test's conformance smoke, whose cluster's policy makes
// the harness's registry the mirror of their registries, as an offline
// cluster's owner would.
func ConformanceOCIImages(in ConformanceInputs, testpod []byte, arch string) (map[string]v1.Image, error) {
	images, err := conformanceImages(in, testpod, arch)
	if err != nil {
		return nil, err
	}
	byRef := make(map[string]v1.Image, len(images))
	for _, c := range images {
		if byRef[c.Ref], err = buildOCIImage(c); err != nil {
			return nil, err
		}
	}
	return byRef, nil
}
