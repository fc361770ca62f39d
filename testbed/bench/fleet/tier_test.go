// Copyright The throttle Authors
// SPDX-License-Identifier: Apache-2.0

package main

import (
	"fmt"
	"math"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/otelthrottle/throttle/testbed/bench/internal/colconfig"
	"github.com/otelthrottle/throttle/testbed/bench/internal/harness"
)

func TestParseTierScenarios(t *testing.T) {
	s, err := parseTierScenarios("all")
	require.NoError(t, err)
	var names []string
	for _, sc := range s {
		names = append(names, sc.name)
	}
	assert.Equal(t, []string{"stock", "memory_limiter", "throttle"}, names)

	s, err = parseTierScenarios("throttle+age=30s, stock+gomemlimit")
	require.NoError(t, err)
	assert.Equal(t, []tierScenario{
		{name: "throttle+age=30s", kind: colconfig.KindThrottle, connAge: 30 * time.Second},
		{name: "stock+gomemlimit", kind: colconfig.KindStock, gomemlimit: true},
	}, s)

	for in, want := range map[string]string{
		"nginx":            `unknown gateway "nginx"`,
		"throttle+age=0s":  "want a positive duration",
		"throttle+age=x":   "want a positive duration",
		"throttle+fast":    `unknown suffix "fast"`,
		"throttle+,stock":  `unknown suffix ""`,
		"stock,,throttle":  `unknown gateway ""`,
		"throttle+age=-1s": "want a positive duration",
	} {
		_, err := parseTierScenarios(in)
		assert.ErrorContains(t, err, want, in)
	}
}

func TestReplicaCapacities(t *testing.T) {
	caps, hows := replicaCapacities([]float64{0.2, 0.2, 0.1}, map[float64]float64{0.2: 16000})
	assert.Equal(t, []float64{16000, 16000, 8000}, caps, "the smaller size scaled by its CPU")
	assert.Equal(t, []string{"measured", "measured", "the 0.2 CPU's × 0.1 / 0.2"}, hows)
	caps, _ = replicaCapacities([]float64{0.2, 0.2, 0.1}, map[float64]float64{0.2: 16000, 0.1: 7000})
	assert.Equal(t, []float64{16000, 16000, 7000}, caps, "each size measured")
}

func TestIncrease(t *testing.T) {
	nan := math.NaN()
	assert.InDelta(t, 30.0, increase([]float64{10, 20, 40}), 0)
	assert.InDelta(t, 30.0, increase([]float64{nan, 10, nan, 20, 40, nan}), 0, "missing values skipped")
	// Restarted at 25 (5 after the restart): 10 + 5 + 10.
	assert.InDelta(t, 25.0, increase([]float64{10, 20, 5, 15}), 0, "a fall is a restart from 0")
	assert.InDelta(t, 0.0, increase([]float64{nan, nan}), 0)
	assert.InDelta(t, 0.0, increase(nil), 0)
}

// TestTierChecks: the tier's targets, round by round, for the throttle
// scenarios only.
func TestTierChecks(t *testing.T) {
	sums := []*tierSummary{
		{Scenario: "stock", Gateway: colconfig.KindStock, Round: 1, Factor: 1, BurstSinkRate: 1000},
		{Scenario: "throttle", Gateway: colconfig.KindThrottle, Round: 1, Factor: 1, BurstSinkRate: 960},
		{Scenario: "stock", Gateway: colconfig.KindStock, Round: 2, Factor: 1, BurstSinkRate: 1000},
		{Scenario: "throttle", Gateway: colconfig.KindThrottle, Round: 2, Factor: 1, BurstSinkRate: 940},
		{
			Scenario: "throttle", Gateway: colconfig.KindThrottle, Round: 1, Factor: 1.5, BurstSinkRate: 950, BurstPctCapacity: 95,
			delivery: delivery{AgentAccepted: 100, SinkSpans: 100}, WeakReplica: "r3", WeakShare: 30, WeakCapShare: 20,
		},
		{
			Scenario: "throttle", Gateway: colconfig.KindThrottle, Round: 2, Factor: 1.5, BurstSinkRate: 800, BurstPctCapacity: 80,
			delivery: delivery{AgentAccepted: 100, SinkSpans: 90, AgentSent: 95, Lost: 5}, OOMKills: 1, WeakReplica: "r3", WeakShare: 31, WeakCapShare: 20,
		},
	}
	met := map[string]bool{}
	for _, c := range tierChecks(sums) {
		met[fmt.Sprintf("%d %g %s", c.round, c.factor, c.target)] = c.met
	}
	assert.Equal(t, map[string]bool{
		"1 1 burst throughput ≥ 0.95× the stock tier's":                  true,
		"2 1 burst throughput ≥ 0.95× the stock tier's":                  false,
		"1 1.5 delivers 100%":                                            true,
		"1 1.5 nothing acknowledged lost":                                true,
		"1 1.5 no OOM kill":                                              true,
		"1 1.5 burst ≥ 90% of the summed capacity":                       true,
		"1 1.5 burst not less than at 1×":                                false,
		"1 1.5 weakest replica's share ≤ its capacity share + 10 points": true,
		"2 1.5 delivers 100%":                                            false,
		"2 1.5 nothing acknowledged lost":                                false,
		"2 1.5 no OOM kill":                                              false,
		"2 1.5 burst ≥ 90% of the summed capacity":                       false,
		"2 1.5 burst not less than at 1×":                                false,
		"2 1.5 weakest replica's share ≤ its capacity share + 10 points": false,
	}, met)
}

// TestWriteTierReport: the tier's report carries the run's machine, commit
// and command above its tables, so that make promote can take it.
func TestWriteTierReport(t *testing.T) {
	dir := t.TempDir()
	require.Error(t, writeTierReport(dir, "grpc"), "no machine.txt")
	require.NoError(t, os.WriteFile(filepath.Join(dir, "machine.txt"), []byte("date (UTC)  2026-12-04T03:07:44Z\ncommit      36bfe4e\ncommand     bin/fleet -tier 3\n"), 0o644))
	require.NoError(t, os.WriteFile(filepath.Join(dir, "summary.md"), []byte("| round |\n"), 0o644))
	require.NoError(t, writeTierReport(dir, "grpc"))
	md, err := os.ReadFile(filepath.Join(dir, "report.md"))
	require.NoError(t, err)
	assert.Equal(t, "# Gateway tier, OTLP/GRPC agents\n\n```\ndate (UTC)  2026-12-04T03:07:44Z\ncommit      36bfe4e\ncommand     bin/fleet -tier 3\n```\n\n| round |\n", string(md))
	info := harness.ParseRunInfo(string(md))
	assert.Equal(t, "36bfe4e", info.Commit, "make promote reads the commit")
	assert.Equal(t, "bin/fleet -tier 3", info.Command)
}
