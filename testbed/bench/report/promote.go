// Copyright The throttle Authors
// SPDX-License-Identifier: Apache-2.0

package report

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"

	"github.com/otelthrottle/throttle/testbed/bench/internal/harness"
)

// MaxBaselineCharts is the most charts a baseline keeps.
const MaxBaselineCharts = 3

// IndexFile is the index of the baselines, in the results folder.
const IndexFile = "README.md"

// Promotion is one run made the baseline of a benchmark.
type Promotion struct {
	// Run is the run's folder (bench/runs/<date>-<name>).
	Run string
	// Results is the folder of the baselines (bench/results) and Baseline
	// the baseline's folder in it (overload-sweep, fleet-http, ...).
	Results, Baseline string
	// Charts are the file names of the charts to keep (at most
	// MaxBaselineCharts); none: every chart of the run, when it has no
	// more than that.
	Charts []string
}

var baselineName = regexp.MustCompile(`^[a-z0-9][a-z0-9-]*$`)

// Promote replaces the baseline's folder with the run's report, summary.csv
// and charts, the report's links to charts not kept taken out, and updates
// the baseline's row of the index (date, commit and command, from the
// report). It changes nothing when the run cannot be promoted: a report
// that does not record its commit and command, too many or too large
// charts.
func Promote(p Promotion) (harness.RunInfo, error) {
	var info harness.RunInfo
	if !baselineName.MatchString(p.Baseline) {
		return info, fmt.Errorf("baseline %q: want a folder name of lower-case letters, digits and dashes (overload-sweep, fleet-http)", p.Baseline)
	}
	md, err := os.ReadFile(filepath.Join(p.Run, "report.md"))
	if err != nil {
		return info, fmt.Errorf("the run's report: %w", err)
	}
	info = harness.ParseRunInfo(string(md))
	if info.Commit == "" || info.Command == "" || len(info.Date) < len("2006-01-02") {
		return info, fmt.Errorf("%s records no date, commit or command (a run from before runs recorded them): the index could not say where the baseline came from", filepath.Join(p.Run, "report.md"))
	}
	summary, err := os.ReadFile(filepath.Join(p.Run, "summary.csv"))
	if err != nil {
		return info, fmt.Errorf("the run's summary: %w", err)
	}
	charts, err := chartsToKeep(p.Run, p.Charts)
	if err != nil {
		return info, err
	}
	index := filepath.Join(p.Results, IndexFile)
	indexMD, err := os.ReadFile(index)
	if err != nil {
		return info, fmt.Errorf("the index of the baselines: %w", err)
	}
	newIndex, err := updateIndex(string(indexMD), p.Baseline, info)
	if err != nil {
		return info, fmt.Errorf("%s: %w", index, err)
	}

	dir := filepath.Join(p.Results, p.Baseline)
	if err := clearBaseline(dir); err != nil {
		return info, err
	}
	files := map[string][]byte{
		"report.md":   []byte(keepCharts(string(md), charts)),
		"summary.csv": summary,
	}
	for _, c := range charts {
		if files[c], err = os.ReadFile(filepath.Join(p.Run, c)); err != nil {
			return info, err
		}
	}
	for name, b := range files {
		if err := os.WriteFile(filepath.Join(dir, name), b, 0o644); err != nil {
			return info, err
		}
	}
	return info, os.WriteFile(index, []byte(newIndex), 0o644)
}

// chartsToKeep checks the charts to keep against the run's: each one of
// them, at most MaxBaselineCharts, none over MaxChartBytes.
func chartsToKeep(run string, want []string) ([]string, error) {
	all, err := filepath.Glob(filepath.Join(run, "*.png"))
	if err != nil {
		return nil, err
	}
	var have []string
	for _, c := range all {
		have = append(have, filepath.Base(c))
	}
	if len(want) == 0 {
		if len(have) > MaxBaselineCharts {
			return nil, fmt.Errorf("the run has %d charts and a baseline keeps at most %d: name them (CHARTS=a.png,b.png), from %s",
				len(have), MaxBaselineCharts, strings.Join(have, ", "))
		}
		want = have
	}
	if len(want) > MaxBaselineCharts {
		return nil, fmt.Errorf("%d charts named, a baseline keeps at most %d", len(want), MaxBaselineCharts)
	}
	for _, c := range want {
		if !slices.Contains(have, c) {
			return nil, fmt.Errorf("chart %q is not in %s (it has %s)", c, run, strings.Join(have, ", "))
		}
		st, err := os.Stat(filepath.Join(run, c))
		if err != nil {
			return nil, err
		}
		if st.Size() > MaxChartBytes {
			return nil, fmt.Errorf("chart %s is %d bytes, a baseline keeps at most %d: render the report again with this build (-report %s)", c, st.Size(), MaxChartBytes, run)
		}
	}
	return want, nil
}

// clearBaseline makes dir an empty folder; it holds only what an earlier
// promotion copied into it.
func clearBaseline(dir string) error {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return err
	}
	entries, err := os.ReadDir(dir)
	if err != nil {
		return err
	}
	for _, e := range entries {
		if e.IsDir() {
			return fmt.Errorf("%s holds a folder, %s: a baseline holds its report, summary and charts only", dir, e.Name())
		}
	}
	for _, e := range entries {
		if err := os.Remove(filepath.Join(dir, e.Name())); err != nil {
			return err
		}
	}
	return nil
}

var imageLine = regexp.MustCompile(`^!\[[^\]]*\]\(([^)]+)\)\s*$`)

// keepCharts takes out of a report the images of the charts not kept, and
// the runs of blank lines that leaves.
func keepCharts(md string, charts []string) string {
	var out []string
	blank := 0
	for _, l := range strings.Split(md, "\n") {
		if m := imageLine.FindStringSubmatch(l); len(m) == 2 && !slices.Contains(charts, m[1]) {
			continue
		}
		blank++
		if strings.TrimSpace(l) != "" {
			blank = 0
		}
		if blank > 1 {
			continue
		}
		out = append(out, l)
	}
	return strings.Join(out, "\n")
}

// The index's table: one row per baseline, its first cell the baseline's
// folder (a link to its report once it has one).
var indexHeader = []string{"baseline", "benchmark", "date", "commit", "command"}

var errNoTable = errors.New("no table of baselines (| " + strings.Join(indexHeader, " | ") + " |)")

// updateIndex sets the baseline's row of the index to info, keeping its
// description; a baseline with no row gets one at the end of the table.
func updateIndex(md, baseline string, info harness.RunInfo) (string, error) {
	lines := strings.Split(md, "\n")
	header := -1
	for i, l := range lines {
		if slices.Equal(cells(l), indexHeader) {
			header = i
			break
		}
	}
	if header < 0 || header+1 >= len(lines) {
		return "", errNoTable
	}
	row := []string{
		fmt.Sprintf("[%s](%s/report.md)", baseline, baseline), baseline, info.Date[:len("2006-01-02")],
		info.Commit, "`" + strings.ReplaceAll(info.Command, "|", `\|`) + "`",
	}
	end := header + 2
	for ; end < len(lines) && strings.HasPrefix(strings.TrimSpace(lines[end]), "|"); end++ {
		c := cells(lines[end])
		if len(c) != len(indexHeader) || rowBaseline(c[0]) != baseline {
			continue
		}
		row[1] = c[1]
		lines[end] = "| " + strings.Join(row, " | ") + " |"
		return strings.Join(lines, "\n"), nil
	}
	lines = slices.Insert(lines, end, "| "+strings.Join(row, " | ")+" |")
	return strings.Join(lines, "\n"), nil
}

// cells splits a Markdown table row into its trimmed cells (nil when l is
// not a row).
func cells(l string) []string {
	l = strings.TrimSpace(l)
	if !strings.HasPrefix(l, "|") || !strings.HasSuffix(l, "|") || len(l) < 2 {
		return nil
	}
	// A \| inside a cell (the commands) is not a separator.
	parts := strings.Split(strings.ReplaceAll(l[1:len(l)-1], `\|`, "\x00"), "|")
	for i, p := range parts {
		parts[i] = strings.ReplaceAll(strings.TrimSpace(p), "\x00", `\|`)
	}
	return parts
}

// rowBaseline is the folder a row's first cell names: "[name](name/...)"
// or "name" (a baseline still pending).
func rowBaseline(cell string) string {
	if strings.HasPrefix(cell, "[") {
		if i := strings.Index(cell, "]"); i > 0 {
			cell = cell[1:i]
		}
	}
	return strings.TrimSuffix(strings.Trim(cell, "`"), "/")
}
