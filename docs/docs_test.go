// Package docs holds Plinth's documentation (Markdown) and this test of
// its rules: every relative link resolves, every page is reachable from
// the README, the README stays short, and no page but the benchmarks and
// the CHANGELOG carries a date (history lives in git and the CHANGELOG).
package docs

import (
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"unicode"
)

// readmeMaxLines bounds the README: what Plinth is, the support matrix,
// the two commands, where to go next.
const readmeMaxLines = 150

// pages are the repository's Markdown pages, relative to the root.
func pages(t *testing.T) (root string, files []string) {
	t.Helper()
	root, err := filepath.Abs("..")
	if err != nil {
		t.Fatal(err)
	}
	files = []string{"README.md", "CONTRIBUTING.md", "CHANGELOG.md"}
	err = filepath.WalkDir(filepath.Join(root, "docs"), func(p string, d os.DirEntry, err error) error {
		if err == nil && !d.IsDir() && strings.HasSuffix(p, ".md") {
			rel, _ := filepath.Rel(root, p)
			files = append(files, rel)
		}
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	return root, files
}

var (
	link    = regexp.MustCompile(`\]\(([^)\s]+)\)`)
	heading = regexp.MustCompile(`(?m)^#{1,6} +(.+)$`)
	date    = regexp.MustCompile(`\b20[0-9]{2}-[01][0-9]-[0-3][0-9]\b`)
)

// anchor is GitHub's anchor for a heading: lower case, punctuation
// dropped, spaces to hyphens.
func anchor(h string) string {
	var b strings.Builder
	for _, r := range strings.ToLower(strings.TrimSpace(h)) {
		switch {
		case r == ' ':
			b.WriteRune('-')
		case r == '-' || r == '_' || unicode.IsLetter(r) || unicode.IsDigit(r):
			b.WriteRune(r)
		}
	}
	return b.String()
}

func anchors(text string) map[string]bool {
	a := map[string]bool{}
	for _, m := range heading.FindAllStringSubmatch(text, -1) {
		a[anchor(strings.ReplaceAll(m[1], "`", ""))] = true
	}
	return a
}

func TestLinksResolve(t *testing.T) {
	root, files := pages(t)
	links := map[string][]string{} // page → the pages it links
	for _, f := range files {
		b, err := os.ReadFile(filepath.Join(root, f))
		if err != nil {
			t.Fatal(err)
		}
		for _, m := range link.FindAllStringSubmatch(string(b), -1) {
			target := m[1]
			if strings.Contains(target, "://") || strings.HasPrefix(target, "mailto:") {
				continue
			}
			path, frag, _ := strings.Cut(target, "#")
			dest := f
			if path != "" {
				dest = filepath.Join(filepath.Dir(f), path)
			}
			full := filepath.Join(root, dest)
			if _, err := os.Stat(full); err != nil {
				t.Errorf("%s: link %s: no %s", f, target, dest)
				continue
			}
			if dest = filepath.Clean(dest); dest != f {
				links[f] = append(links[f], dest)
			}
			if frag != "" && strings.HasSuffix(dest, ".md") {
				text, _ := os.ReadFile(full)
				if !anchors(string(text))[frag] {
					t.Errorf("%s: link %s: no heading #%s in %s", f, target, frag, dest)
				}
			}
		}
	}
	reached, todo := map[string]bool{"README.md": true}, []string{"README.md"}
	for len(todo) > 0 {
		f := todo[0]
		todo = todo[1:]
		for _, d := range links[f] {
			if !reached[d] {
				reached[d] = true
				todo = append(todo, d)
			}
		}
	}
	for _, f := range files {
		if !reached[f] {
			t.Errorf("%s cannot be reached from README.md by its links", f)
		}
	}
}

func TestNoHistoryInDocs(t *testing.T) {
	root, files := pages(t)
	for _, f := range files {
		// The benchmarks' figures carry their dates, and so will the
		// CHANGELOG's releases.
		if f == filepath.Join("docs", "benchmarks.md") || f == "CHANGELOG.md" {
			continue
		}
		b, err := os.ReadFile(filepath.Join(root, f))
		if err != nil {
			t.Fatal(err)
		}
		if d := date.FindString(string(b)); d != "" {
			t.Errorf("%s carries a date (%s): measurements belong in docs/benchmarks.md, history in git and the CHANGELOG", f, d)
		}
	}
	readme, err := os.ReadFile(filepath.Join(root, "README.md"))
	if err != nil {
		t.Fatal(err)
	}
	if n := strings.Count(string(readme), "\n"); n > readmeMaxLines {
		t.Errorf("README.md has %d lines, at most %d: the rest belongs in docs/", n, readmeMaxLines)
	}
}
