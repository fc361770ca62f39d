// Copyright The throttle Authors
// SPDX-License-Identifier: Apache-2.0

package main

import (
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
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
	assert.Equal(t, []scenario{referenceScenario, {name: "throttle+gomemlimit", kind: gwThrottle, gomemlimit: true}}, got)

	_, err = parseScenarios("throttle,baseline")
	require.ErrorContains(t, err, `unknown scenario "baseline"`)
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
	assert.Contains(t, b.String(), "| 18000 (0%) | 90% |")

	// Without a reference in the run the column says so.
	b.Reset()
	printSummaries(&b, sums[:1])
	assert.Zero(t, sums[0].BurstPctReference)
	assert.Contains(t, b.String(), "| 18000 (0%) | n/a |")
}
