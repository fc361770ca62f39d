// Copyright The throttle Authors
// SPDX-License-Identifier: Apache-2.0

package main

import (
	"bytes"
	"fmt"
	"io/fs"
	"math"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/otelthrottle/throttle/testbed/bench/report"
)

// TestExpandRepeat: -repeat runs the whole list once per round, each round
// with its own A, and names every run after its round.
func TestExpandRepeat(t *testing.T) {
	f := func(repeat int, want []string) {
		t.Helper()
		got, err := expandScenarios(options{scenarios: "A,D", factors: "2", thresholds: "default,benchmark", repeat: repeat})
		require.NoError(t, err)
		var names []string
		for _, s := range got {
			names = append(names, s.name)
		}
		assert.Equal(t, want, names)
	}
	f(1, []string{"A", "D@2x", "D@2x+benchmark"})
	f(0, []string{"A", "D@2x", "D@2x+benchmark"})
	f(2, []string{"A-r1", "D@2x-r1", "D@2x+benchmark-r1", "A-r2", "D@2x-r2", "D@2x+benchmark-r2"})

	// The round is carried, not parsed back out of the name.
	got, err := expandScenarios(options{scenarios: "D", factors: "2", thresholds: "default", repeat: 2})
	require.NoError(t, err)
	require.Len(t, got, 2)
	assert.Equal(t, "D@2x", got[1].base)
	assert.Equal(t, 2, got[1].round)

	_, err = expandScenarios(options{scenarios: "A", repeat: -1})
	assert.ErrorContains(t, err, "-repeat")
}

// TestMedians: a scenario's share of A is taken in each round against that
// round's A, then the median; not the ratio of the medians, which pairs
// runs minutes apart on a machine whose speed moves between them.
func TestMedians(t *testing.T) {
	run := func(base string, round int, goodput float64, p99ms int, oom uint64) *summary {
		return &summary{
			Scenario: fmt.Sprintf("%s-r%d", base, round), base: base, round: round,
			Goodput: goodput, P99: time.Duration(p99ms) * time.Millisecond, OOMKills: oom,
		}
	}
	got := medians([]*summary{
		run("A", 1, 100, 10, 0), run("D@2x", 1, 90, 300, 0),
		run("A", 2, 200, 12, 0), run("D@2x", 2, 150, 500, 1),
		run("A", 3, 150, 11, 0), run("D@2x", 3, 150, 400, 0),
	})
	require.Len(t, got, 2)
	a, d := got[0], got[1]
	assert.Equal(t, "A", a.Scenario)
	assert.Equal(t, 3, a.Rounds)
	assert.InDelta(t, 1, a.OfA, 1e-9)
	assert.Equal(t, "D@2x", d.Scenario)
	assert.InDelta(t, 150, d.Goodput, 1e-9)
	assert.InDelta(t, 0.9, d.OfA, 1e-9, "rounds: 90 %, 75 %, 100 %")
	assert.InDelta(t, 0.75, d.OfAMin, 1e-9)
	assert.InDelta(t, 1.0, d.OfAMax, 1e-9)
	assert.Equal(t, 400*time.Millisecond, d.P99)
	assert.Equal(t, 300*time.Millisecond, d.P99Min)
	assert.Equal(t, 500*time.Millisecond, d.P99Max)
	assert.EqualValues(t, 1, d.OOMKills)

	// An even number of rounds takes the mean of the middle two; without
	// an A there is no share.
	got = medians([]*summary{run("D@2x", 1, 100, 100, 0), run("D@2x", 2, 200, 300, 0)})
	require.Len(t, got, 1)
	assert.InDelta(t, 150, got[0].Goodput, 1e-9)
	assert.Equal(t, 200*time.Millisecond, got[0].P99)
	assert.True(t, math.IsNaN(got[0].OfA))

	var b bytes.Buffer
	printMedians(&b, []*summary{run("A", 1, 100, 10, 0), run("D@2x", 1, 90, 300, 0), run("D@2x+benchmark", 1, 95, 250, 0)})
	assert.Contains(t, b.String(), "| D@2x | 1 | 90 | 90 (90–90) | 300 (300–300) | 0 |")
	assert.Contains(t, b.String(), "| D@2x+benchmark | 1 | 95 | 95 (95–95) | 250 (250–250) | 0 |")
}

// TestMediansInTheReport: with rounds, the medians reach the run's report
// (report.ExtraFile), which is what a baseline keeps; a run of one round
// has none.
func TestMediansInTheReport(t *testing.T) {
	for _, repeat := range []int{1, 2} {
		o := options{out: t.TempDir(), repeat: repeat}
		var sums []*summary
		for r := 1; r <= repeat; r++ {
			for _, s := range []struct {
				base    string
				goodput float64
			}{{"A", 100}, {"D@2x", 90}} {
				sums = append(sums, &summary{
					Scenario: fmt.Sprintf("%s-r%d", s.base, r), base: s.base, round: r, Throttle: s.base != "A",
					Goodput: s.goodput, P99: 300 * time.Millisecond,
				})
			}
		}
		require.NoError(t, writeSummaries(o, sums))
		extra, err := os.ReadFile(filepath.Join(o.out, report.ExtraFile))
		if repeat == 1 {
			require.ErrorIs(t, err, fs.ErrNotExist)
			continue
		}
		require.NoError(t, err)
		assert.Contains(t, string(extra), "| D@2x | 2 | 90 | 90 (90–90) | 300 (300–300) | 0 |")
		require.NoError(t, os.WriteFile(filepath.Join(o.out, "timeline.csv"), []byte("scenario,t_s,phase\n"), 0o644))
		files, err := report.Generate(o.out)
		require.NoError(t, err)
		md, err := os.ReadFile(files.Markdown)
		require.NoError(t, err)
		assert.Contains(t, string(md), "| D@2x | 2 | 90 | 90 (90–90) | 300 (300–300) | 0 |")
	}
}
