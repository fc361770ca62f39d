// Copyright The throttle Authors
// SPDX-License-Identifier: Apache-2.0

package mdlinks

import (
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// TestRepositoryLinks fails on a dead relative link in the repository's
// tracked Markdown (make lint runs it): every link points at a tracked
// file, and every anchor at a heading of the file it names.
func TestRepositoryLinks(t *testing.T) {
	out, err := exec.Command("git", "rev-parse", "--show-toplevel").Output()
	if err != nil {
		t.Skipf("not in a git checkout: %v", err)
	}
	root := strings.TrimSpace(string(out))
	files, err := Tracked(root)
	require.NoError(t, err)
	dead, err := Check(root, files)
	require.NoError(t, err)
	for _, d := range dead {
		t.Errorf("dead link: %s", d)
	}
}

func TestCheck(t *testing.T) {
	root := t.TempDir()
	put := func(name, content string) {
		p := filepath.Join(root, filepath.FromSlash(name))
		require.NoError(t, os.MkdirAll(filepath.Dir(p), 0o755))
		require.NoError(t, os.WriteFile(p, []byte(content), 0o644))
	}
	put("README.md", strings.Join([]string{
		"# throttle", // 1
		"[results](docs/results.md#the-gcs-pace)",                                        // 2 ok
		"[gone](bench/results/2026-12-02-soak/report.md)",                                // 3 untracked file
		"![chart](bench/results/soak/timeline%20D.png)",                                  // 4 ok, escaped
		"[anchor](docs/results.md#no-such-heading)",                                      // 5 bad anchor
		"[folder](bench/results) and [web](https://example.com/x.md) [mail](mailto:a@b)", // 6 ok
		"`[in code](nowhere.md)` [self](#throttle)",                                      // 7 ok
		"```",
		"[in a fence](nowhere.md)",
		"```",
		"[up](../outside.md) [missing](docs/deleted.md)",                               // 11 outside, tracked but missing
		`<img src="docs/status.png"> [ref]: docs/nothing.md`,                           // 12 ok, then not a definition
		"[ref]: docs/nothing.md",                                                       // 13 untracked
		`[titled](docs/results.md "The results") [nested [brackets]](docs/results.md)`, // 14 ok
	}, "\n"))
	put("docs/results.md", "# Results\n\n## The GC's pace\n\n### `observe_only` and the lines\n\n## Speed\n\n## Speed\n[back](../README.md#throttle)\n[repeat](#speed-1) [code](#observe_only-and-the-lines)\n")
	put("docs/status.png", "png")
	put("bench/results/soak/timeline D.png", "png")
	put("bench/results/2026-12-02-soak/report.md", "# untracked\n")
	files := []string{"README.md", "docs/results.md", "docs/status.png", "bench/results/soak/timeline D.png", "docs/deleted.md"}
	dead, err := Check(root, files)
	require.NoError(t, err)
	var got []string
	for _, d := range dead {
		got = append(got, d.String())
	}
	assert.Equal(t, []string{
		"README.md:3: bench/results/2026-12-02-soak/report.md: not a tracked file",
		"README.md:5: docs/results.md#no-such-heading: no heading of docs/results.md has the anchor #no-such-heading",
		"README.md:11: ../outside.md: outside the repository",
		"README.md:11: docs/deleted.md: tracked but missing from the work tree",
		"README.md:13: docs/nothing.md: not a tracked file",
	}, got)
}

func TestSlug(t *testing.T) {
	for in, want := range map[string]string{
		"The GC's pace":                                   "the-gcs-pace",
		"Overload benchmark (2026-11-29)":                 "overload-benchmark-2026-11-29",
		"Tuning the lines and `observe_only`":             "tuning-the-lines-and-observe_only",
		"Waiting for the budget, and more held (0.5 CPU)": "waiting-for-the-budget-and-more-held-05-cpu",
		"See [design](design.md) §7":                      "see-design-7",
	} {
		assert.Equal(t, want, Slug(in), in)
	}
}
