// Copyright The throttle Authors
// SPDX-License-Identifier: Apache-2.0

// Package mdlinks finds the dead relative links of a repository's Markdown:
// a link or image whose file is not tracked, or whose #anchor names no
// heading of the Markdown file it points at. Links to other sites are not
// followed.
package mdlinks

import (
	"bytes"
	"fmt"
	"net/url"
	"os"
	"os/exec"
	"path"
	"path/filepath"
	"regexp"
	"strings"
	"unicode"
)

// Dead is one dead link.
type Dead struct {
	File   string // the Markdown file, relative to the repository root
	Line   int
	Target string // as written
	Reason string
}

func (d Dead) String() string {
	return fmt.Sprintf("%s:%d: %s: %s", d.File, d.Line, d.Target, d.Reason)
}

// Tracked lists the files git tracks in the checkout at root, relative to
// it, in slash form.
func Tracked(root string) ([]string, error) {
	out, err := exec.Command("git", "-C", root, "ls-files", "-z").Output()
	if err != nil {
		return nil, fmt.Errorf("git ls-files in %s: %w", root, err)
	}
	var files []string
	for _, f := range bytes.Split(out, []byte{0}) {
		if len(f) > 0 {
			files = append(files, string(f))
		}
	}
	return files, nil
}

// Check returns the dead relative links of the Markdown files among files
// (paths relative to root, in slash form): a target must be one of files
// (or a folder holding one) and present under root; an anchor into a
// Markdown file must name one of its headings.
func Check(root string, files []string) ([]Dead, error) {
	tracked := make(map[string]bool, len(files))
	dirs := map[string]bool{}
	for _, f := range files {
		tracked[f] = true
		for d := path.Dir(f); d != "."; d = path.Dir(d) {
			dirs[d] = true
		}
	}
	anchors := map[string]map[string]bool{}
	anchorsOf := func(f string) (map[string]bool, error) {
		if a, ok := anchors[f]; ok {
			return a, nil
		}
		b, err := os.ReadFile(filepath.Join(root, filepath.FromSlash(f)))
		if err != nil {
			return nil, err
		}
		anchors[f] = Anchors(string(b))
		return anchors[f], nil
	}
	var dead []Dead
	for _, f := range files {
		if !strings.HasSuffix(f, ".md") {
			continue
		}
		b, err := os.ReadFile(filepath.Join(root, filepath.FromSlash(f)))
		if err != nil {
			if os.IsNotExist(err) { // tracked, deleted in the work tree
				continue
			}
			return nil, err
		}
		for _, l := range Links(string(b)) {
			target, fragment, _ := strings.Cut(l.Target, "#")
			report := func(reason string) {
				dead = append(dead, Dead{File: f, Line: l.Line, Target: l.Target, Reason: reason})
			}
			file := f
			if target != "" {
				p, err := url.PathUnescape(target)
				if err != nil {
					report("not a valid path")
					continue
				}
				if strings.HasPrefix(p, "/") {
					file = path.Clean(strings.TrimPrefix(p, "/"))
				} else {
					file = path.Join(path.Dir(f), p)
				}
				if file == ".." || strings.HasPrefix(file, "../") {
					report("outside the repository")
					continue
				}
				if file == "." || dirs[file] {
					if fragment != "" {
						report("an anchor into a folder")
					}
					continue
				}
				if !tracked[file] {
					report("not a tracked file")
					continue
				}
				if _, err := os.Stat(filepath.Join(root, filepath.FromSlash(file))); err != nil {
					report("tracked but missing from the work tree")
					continue
				}
			}
			if fragment == "" || !strings.HasSuffix(file, ".md") {
				continue
			}
			a, err := anchorsOf(file)
			if err != nil {
				return nil, err
			}
			if !a[strings.ToLower(fragment)] {
				report(fmt.Sprintf("no heading of %s has the anchor #%s", file, fragment))
			}
		}
	}
	return dead, nil
}

// Link is one relative link of a Markdown document.
type Link struct {
	Line   int
	Target string
}

var (
	// inlineLink matches [text](target) and ![alt](target), with an
	// optional title after the target.
	inlineLink = regexp.MustCompile(`!?\[(?:[^\[\]]|\[[^\[\]]*\])*\]\(\s*(<[^>]*>|[^\s)]+)(?:\s+"[^"]*")?\s*\)`)
	// refDefinition matches a reference definition: [id]: target.
	refDefinition = regexp.MustCompile(`^\s{0,3}\[[^\]]+\]:\s*(<[^>]*>|\S+)`)
	// htmlLink matches the src and href attributes of HTML in Markdown.
	htmlLink = regexp.MustCompile(`\b(?:src|href)="([^"]+)"`)
	codeSpan = regexp.MustCompile("`+[^`]*`+")
	scheme   = regexp.MustCompile(`^[a-zA-Z][a-zA-Z0-9+.-]*:`)
)

// Links returns the relative links of a Markdown document, outside code.
func Links(md string) []Link {
	var out []Link
	inFence := ""
	for i, l := range strings.Split(md, "\n") {
		if fence := fenceOf(l); fence != "" {
			switch {
			case inFence == "":
				inFence = fence
			case strings.HasPrefix(strings.TrimSpace(l), inFence):
				inFence = ""
			}
			continue
		}
		if inFence != "" {
			continue
		}
		l = codeSpan.ReplaceAllString(l, "")
		var targets []string
		for _, m := range inlineLink.FindAllStringSubmatch(l, -1) {
			targets = append(targets, m[1])
		}
		if m := refDefinition.FindStringSubmatch(l); m != nil {
			targets = append(targets, m[1])
		}
		for _, m := range htmlLink.FindAllStringSubmatch(l, -1) {
			targets = append(targets, m[1])
		}
		for _, t := range targets {
			t = strings.TrimSuffix(strings.TrimPrefix(t, "<"), ">")
			if t == "" || scheme.MatchString(t) || strings.HasPrefix(t, "//") {
				continue
			}
			out = append(out, Link{Line: i + 1, Target: t})
		}
	}
	return out
}

// fenceOf returns the fence a line opens or closes a code block with
// ("```" or "~~~", as long as written), or "".
func fenceOf(l string) string {
	t := strings.TrimLeft(l, " ")
	if len(l)-len(t) > 3 {
		return ""
	}
	for _, c := range []string{"`", "~"} {
		n := len(t) - len(strings.TrimLeft(t, c))
		if n >= 3 {
			return strings.Repeat(c, n)
		}
	}
	return ""
}

var (
	heading    = regexp.MustCompile(`^\s{0,3}#{1,6}\s+(.*?)\s*#*\s*$`)
	htmlAnchor = regexp.MustCompile(`<a\s+(?:name|id)="([^"]+)"`)
	linkText   = regexp.MustCompile(`!?\[([^\]]*)\]\([^)]*\)`)
)

// Anchors returns the anchors of a Markdown document's headings as GitHub
// makes them (lower case; punctuation but hyphens and underscores dropped;
// spaces made hyphens; -1, -2 for repeats), and of its <a name> and
// <a id> tags.
func Anchors(md string) map[string]bool {
	out := map[string]bool{}
	seen := map[string]int{}
	inFence := ""
	for _, l := range strings.Split(md, "\n") {
		if fence := fenceOf(l); fence != "" {
			switch {
			case inFence == "":
				inFence = fence
			case strings.HasPrefix(strings.TrimSpace(l), inFence):
				inFence = ""
			}
			continue
		}
		if inFence != "" {
			continue
		}
		for _, m := range htmlAnchor.FindAllStringSubmatch(l, -1) {
			out[strings.ToLower(m[1])] = true
		}
		m := heading.FindStringSubmatch(l)
		if m == nil {
			continue
		}
		slug := Slug(m[1])
		if n := seen[slug]; n > 0 {
			out[fmt.Sprintf("%s-%d", slug, n)] = true
		} else {
			out[slug] = true
		}
		seen[slug]++
	}
	return out
}

// Slug is the anchor GitHub gives a heading's text.
func Slug(text string) string {
	text = linkText.ReplaceAllString(text, "$1")
	var b strings.Builder
	for _, r := range strings.ToLower(text) {
		switch {
		case r == ' ':
			b.WriteRune('-')
		case r == '-' || r == '_' || unicode.IsLetter(r) || unicode.IsNumber(r) || unicode.Is(unicode.Mn, r):
			b.WriteRune(r)
		}
	}
	return b.String()
}
