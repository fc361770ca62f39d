// Copyright The throttle Authors
// SPDX-License-Identifier: Apache-2.0

package report

import (
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/otelthrottle/throttle/testbed/bench/internal/harness"
)

const testIndex = `# Benchmark baselines

Text before the table.

| baseline | benchmark | date | commit | command |
| --- | --- | --- | --- | --- |
| [overload-sweep](overload-sweep/report.md) | the overload sweep | 2026-12-01 | 1111111 | ` + "`bin/overload -old`" + ` |
| [soak](soak/report.md) | the soak | 2026-12-02 | 2222222 | ` + "`overload.test -soak.rate=1500`" + ` |
| clients | the client matrix | pending | | |

Text after the table.
`

// promotionRun writes a run of the overload benchmark (A and D, two
// charts) whose report records where it came from.
func promotionRun(t *testing.T) string {
	t.Helper()
	run := t.TempDir()
	writeRun(t, run)
	machine := harness.MachineInfo([]string{"bin/overload", "-scenarios", "A,D", "-throttle-config", "a b.yaml"})
	require.NoError(t, os.WriteFile(filepath.Join(run, "machine.txt"), []byte(machine), 0o644))
	_, err := Generate(run)
	require.NoError(t, err)
	return run
}

// promotionFixture: a results folder with an index and an overload-sweep
// baseline holding an older chart, and a copy of the run in template.
func promotionFixture(t *testing.T, template string) (results, run string) {
	t.Helper()
	root := t.TempDir()
	results, run = filepath.Join(root, "bench", "results"), filepath.Join(root, "bench", "runs", "2026-12-04-overload")
	require.NoError(t, os.MkdirAll(filepath.Join(results, "overload-sweep"), 0o755))
	require.NoError(t, os.WriteFile(filepath.Join(results, IndexFile), []byte(testIndex), 0o644))
	for _, f := range []string{"report.md", "summary.csv", "timeline-D@4x-r1.png"} {
		require.NoError(t, os.WriteFile(filepath.Join(results, "overload-sweep", f), []byte("old"), 0o644))
	}
	require.NoError(t, os.CopyFS(run, os.DirFS(template)))
	return results, run
}

func dirNames(t *testing.T, dir string) []string {
	t.Helper()
	entries, err := os.ReadDir(dir)
	require.NoError(t, err)
	var names []string
	for _, e := range entries {
		names = append(names, e.Name())
	}
	return names
}

// TestPromote: promotion of one run (written once by the report generator)
// into fresh results folders.
func TestPromote(t *testing.T) {
	template := promotionRun(t)
	t.Run("replaces the baseline", func(t *testing.T) { testPromoteReplaces(t, template) })
	t.Run("pending and new baselines", func(t *testing.T) { testPromotePending(t, template) })
	t.Run("refuses", func(t *testing.T) { testPromoteRefuses(t, template) })
}

// testPromoteReplaces: the baseline becomes the run's report, summary and
// the charts named, the report links only to what the baseline holds, and
// the index's row says where the run came from; the rest of the index
// stays.
func testPromoteReplaces(t *testing.T, template string) {
	results, run := promotionFixture(t, template)
	info, err := Promote(Promotion{Run: run, Results: results, Baseline: "overload-sweep", Charts: []string{"timeline-D.png"}})
	require.NoError(t, err)

	dir := filepath.Join(results, "overload-sweep")
	assert.Equal(t, []string{"report.md", "summary.csv", "timeline-D.png"}, dirNames(t, dir), "the old chart gone, A's chart not kept")
	want, err := os.ReadFile(filepath.Join(run, "summary.csv"))
	require.NoError(t, err)
	got, err := os.ReadFile(filepath.Join(dir, "summary.csv"))
	require.NoError(t, err)
	assert.Equal(t, want, got)
	md, err := os.ReadFile(filepath.Join(dir, "report.md"))
	require.NoError(t, err)
	assert.Contains(t, string(md), "| D (throttle) |")
	assert.NotContains(t, string(md), "\n\n\n")
	links := regexp.MustCompile(`\]\(([^)]+)\)`).FindAllStringSubmatch(string(md), -1)
	require.NotEmpty(t, links)
	for _, l := range links {
		assert.FileExists(t, filepath.Join(dir, l[1]), "the report links to what the baseline holds")
	}

	assert.Equal(t, "bin/overload -scenarios A,D -throttle-config 'a b.yaml'", info.Command)
	index, err := os.ReadFile(filepath.Join(results, IndexFile))
	require.NoError(t, err)
	row := "| [overload-sweep](overload-sweep/report.md) | the overload sweep | " + info.Date[:10] + " | " + info.Commit +
		" | `bin/overload -scenarios A,D -throttle-config 'a b.yaml'` |"
	assert.Contains(t, string(index), row+"\n| [soak](soak/report.md) |", "the row in its place, its description kept")
	assert.Equal(t, strings.Replace(testIndex, testIndex[strings.Index(testIndex, "| [overload-sweep]"):strings.Index(testIndex, "| [soak]")], row+"\n", 1), string(index),
		"nothing else of the index changed")
}

// testPromotePending: a pending baseline's row gets its link and figures;
// a baseline the index does not list gets a row at the end of the table.
func testPromotePending(t *testing.T, template string) {
	results, run := promotionFixture(t, template)
	info, err := Promote(Promotion{Run: run, Results: results, Baseline: "clients"})
	require.NoError(t, err)
	assert.Equal(t, []string{"report.md", "summary.csv", "timeline-A.png", "timeline-D.png"}, dirNames(t, filepath.Join(results, "clients")),
		"two charts: both kept without naming them")
	_, err = Promote(Promotion{Run: run, Results: results, Baseline: "tier", Charts: []string{"timeline-D.png"}})
	require.NoError(t, err)
	index, err := os.ReadFile(filepath.Join(results, IndexFile))
	require.NoError(t, err)
	tail := "| [clients](clients/report.md) | the client matrix | " + info.Date[:10] + " | " + info.Commit + " | `" + info.Command + "` |\n" +
		"| [tier](tier/report.md) | tier | " + info.Date[:10] + " | " + info.Commit + " | `" + info.Command + "` |\n\nText after the table.\n"
	assert.True(t, strings.HasSuffix(string(index), tail), string(index))
}

// testPromoteRefuses: a run that cannot be a baseline changes nothing, and
// the error says why.
func testPromoteRefuses(t *testing.T, template string) {
	for name, tc := range map[string]struct {
		prepare func(t *testing.T, run string)
		p       Promotion
		want    string
	}{
		"no commit recorded": {
			prepare: func(t *testing.T, run string) {
				md, err := os.ReadFile(filepath.Join(run, "report.md"))
				require.NoError(t, err)
				md = regexp.MustCompile(`(?m)^commit .*\n`).ReplaceAll(md, nil)
				require.NoError(t, os.WriteFile(filepath.Join(run, "report.md"), md, 0o644))
			},
			want: "records no date, commit or command",
		},
		"too many charts": {
			prepare: func(t *testing.T, run string) {
				for _, c := range []string{"timeline-B.png", "timeline-C.png"} {
					require.NoError(t, os.WriteFile(filepath.Join(run, c), []byte("png"), 0o644))
				}
			},
			want: "the run has 4 charts and a baseline keeps at most 3",
		},
		"a chart too large": {
			prepare: func(t *testing.T, run string) {
				require.NoError(t, os.WriteFile(filepath.Join(run, "timeline-D.png"), make([]byte, MaxChartBytes+1), 0o644))
			},
			want: "a baseline keeps at most 150000",
		},
		"a chart the run does not have": {
			p:    Promotion{Charts: []string{"timeline-Z.png"}},
			want: `chart "timeline-Z.png" is not in`,
		},
		"a baseline outside the results": {
			p:    Promotion{Baseline: "../docs"},
			want: "want a folder name",
		},
	} {
		t.Run(name, func(t *testing.T) {
			results, run := promotionFixture(t, template)
			if tc.prepare != nil {
				tc.prepare(t, run)
			}
			p := tc.p
			p.Run, p.Results = run, results
			if p.Baseline == "" {
				p.Baseline = "overload-sweep"
			}
			_, err := Promote(p)
			require.Error(t, err)
			assert.Contains(t, err.Error(), tc.want)
			index, err := os.ReadFile(filepath.Join(results, IndexFile))
			require.NoError(t, err)
			assert.Equal(t, testIndex, string(index))
			assert.Equal(t, []string{"report.md", "summary.csv", "timeline-D@4x-r1.png"}, dirNames(t, filepath.Join(results, "overload-sweep")))
			assert.False(t, slices.Contains(dirNames(t, results), "docs"))
		})
	}
}
