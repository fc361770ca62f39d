// Copyright The throttle Authors
// SPDX-License-Identifier: Apache-2.0

package main

import (
	"math"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/otelthrottle/throttle/testbed/bench/internal/colconfig"
)

func TestParseScenarios(t *testing.T) {
	all, err := parseScenarios("all")
	require.NoError(t, err)
	require.Len(t, all, 1+2*len(kinds))
	assert.Equal(t, referenceScenario, all[0], "the reference runs first")
	for _, s := range all[1:] {
		assert.False(t, s.unlimited, s.name)
	}

	got, err := parseScenarios("reference, throttle+gomemlimit")
	require.NoError(t, err)
	assert.Equal(t, []scenario{referenceScenario, {name: "throttle+gomemlimit", kind: colconfig.KindThrottle, gomemlimit: true}}, got)

	_, err = parseScenarios("throttle,baseline")
	require.ErrorContains(t, err, `unknown scenario "baseline"`)

	got, err = parseScenarios("throttle+downstream,throttle+downstream+gomemlimit")
	require.NoError(t, err)
	assert.Equal(t, []scenario{
		{name: "throttle+downstream", kind: colconfig.KindThrottle, downstream: true},
		{name: "throttle+downstream+gomemlimit", kind: colconfig.KindThrottle, downstream: true, gomemlimit: true},
	}, got)
	_, err = parseScenarios("stock+downstream")
	require.ErrorContains(t, err, "for throttle only")
}

// The gateway's counters over a scenario count across its restarts and
// skip the points without a fresh scrape.
func TestSummaryGatewayCounts(t *testing.T) {
	nan := math.NaN()
	pt := func(refused, denied float64) point {
		return point{state: nan, gw: gatewayCounts{refused: refused, enqueueFailed: nan, denied: denied}}
	}
	f := &fleet{}
	f.rec = &recorder{}
	f.rec.points = []point{pt(0, 0), pt(100, 2), pt(nan, nan), pt(300, 5), pt(50, 1)}
	sum := summarize(options{burst: time.Second}, scenario{name: "s", kind: colconfig.KindThrottle}, f, &burst{})
	assert.Equal(t, 350.0, sum.GwRefusedSpans, "300, then 50 after a restart")
	assert.Equal(t, 6.0, sum.GwDeniedRequests)
	assert.Zero(t, sum.GwEnqueueFailedSpans, "never scraped: none counted")
}

func TestSummaryReference(t *testing.T) {
	sums := []*summary{
		{Scenario: "throttle", BurstSinkRate: 18000},
		{Scenario: "reference", BurstSinkRate: 20000},
	}
	var b strings.Builder
	printSummaries(&b, sums)
	assert.InDelta(t, 90, sums[0].BurstPctReference, 1e-9)
	assert.InDelta(t, 100, sums[1].BurstPctReference, 1e-9)
	assert.Contains(t, b.String(), "| 18000 (0%) | 90% | n/a |")

	// Without a reference in the run the column says so.
	b.Reset()
	printSummaries(&b, sums[:1])
	assert.Zero(t, sums[0].BurstPctReference)
	assert.Contains(t, b.String(), "| 18000 (0%) | n/a |")
}

// TestBacklogRate: after the burst, the sink's rate is taken while the
// agents still hold at least a quarter of the backlog they had when it
// ended, the gateway still saturated; too small a backlog or too short a
// stretch measures nothing.
func TestBacklogRate(t *testing.T) {
	// pts: one point a second from 0 to end s; the agents' queue is
	// queueAt(s), the sink takes 20,000 spans/s until 60 s, 15,000 after.
	pts := func(end int, queueAt func(s int) float64) []point {
		var out []point
		sink := 0.0
		for s := 0; s <= end; s++ {
			if s > 0 {
				sink += map[bool]float64{true: 20000, false: 15000}[s <= 60]
			}
			out = append(out, point{basePoint: basePoint{t: time.Duration(s) * time.Second, flow: flow{agQueue: queueAt(s), sinkSpans: sink}}})
		}
		return out
	}
	f := func(p []point, burstEnd time.Duration, wantRate, wantSecs float64) {
		t.Helper()
		rate, secs := backlogRate(p, burstEnd, 4*agentSenders)
		assert.InDelta(t, wantRate, rate, 1e-6)
		assert.InDelta(t, wantSecs, secs, 1e-6)
	}
	// 400 queued when the burst ends at 60 s, drained by 5 a second:
	// under 100 (a quarter) after 120 s.
	draining := func(s int) float64 { return max(0, 400-5*float64(s-60)) }
	f(pts(200, draining), 60*time.Second, 15000, 60)
	// The burst's end between two points: from the next one.
	f(pts(200, draining), 59500*time.Millisecond, 15000, 60)
	// Fewer queued than the four agents' senders: not saturated.
	f(pts(200, func(int) float64 { return 30 }), 60*time.Second, 0, 0)
	// Drained within 10 s: too short to measure.
	f(pts(200, func(s int) float64 { return max(0, 400-80*float64(s-60)) }), 60*time.Second, 0, 0)
	// The recording ended with the burst.
	f(pts(60, draining), 61*time.Second, 0, 0)
}
