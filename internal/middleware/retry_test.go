// Copyright The throttle Authors
// SPDX-License-Identifier: Apache-2.0

package middleware

import (
	"maps"
	"slices"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/otelthrottle/throttle/internal/decision"
)

// TestRetryDelay: the hint follows why a request was refused, always in
// whole seconds within the range: a budget refusal 1 s, a shed one a short
// draw (up to 2 s), an Open one between half and all of how long the Open
// has lasted, so that a client whose whole export must fit in 10 s is
// never told to wait longer than the Open is likely to last.
func TestRetryDelay(t *testing.T) {
	draws := func(d *RetryDelay, v decision.Verdict) map[time.Duration]int {
		seen := map[time.Duration]int{}
		for range 2000 {
			got := d.Draw(v)
			require.Zero(t, got%time.Second, "whole seconds")
			seen[got]++
		}
		return seen
	}
	keys := func(m map[time.Duration]int) []time.Duration { return slices.Sorted(maps.Keys(m)) }
	s := time.Second

	var open time.Duration
	d := NewRetryDelay(DefaultRetryFloor, DefaultRetryCeiling, func() time.Duration { return open }, nil)
	assert.Equal(t, []time.Duration{1 * s, 2 * s}, keys(draws(d, decision.VerdictDenyShed)), "shed: short")
	assert.Equal(t, BudgetRetryDelay, d.Draw(decision.VerdictDenyBudget))
	assert.Zero(t, d.Draw(decision.VerdictAdmit))
	open = 300 * time.Millisecond
	assert.Equal(t, []time.Duration{1 * s}, keys(draws(d, decision.VerdictDenyOpen)), "a new Open: the minimum")
	open = 4 * s
	assert.Equal(t, []time.Duration{2 * s, 3 * s, 4 * s}, keys(draws(d, decision.VerdictDenyOpen)), "half to all of its age")
	open = time.Minute
	assert.Equal(t, []time.Duration{3 * s, 4 * s, 5 * s}, keys(draws(d, decision.VerdictDenyOpen)), "capped at max")

	// Without openFor an Open hint is drawn from the whole range; the
	// bounds clamp every kind.
	wide := NewRetryDelay(2*s, 30*s, nil, nil)
	assert.Len(t, draws(wide, decision.VerdictDenyOpen), 29)
	assert.Equal(t, []time.Duration{2 * s}, keys(draws(wide, decision.VerdictDenyShed)), "shed clamped up to min")
	assert.Equal(t, 2*s, wide.Draw(decision.VerdictDenyBudget), "budget clamped up to min")
	lo := NewRetryDelay(0, 30*s, nil, func(int64) int64 { return 0 })
	hi := NewRetryDelay(0, 30*s, nil, func(n int64) int64 { return n - 1 })
	assert.Zero(t, lo.Draw(decision.VerdictDenyOpen))
	assert.Equal(t, 30*s, hi.Draw(decision.VerdictDenyOpen))

	// Rounding: min up, max down, max below min collapses to min.
	r := NewRetryDelay(1500*time.Millisecond, 1700*time.Millisecond, nil, nil)
	assert.Equal(t, 2*s, r.Draw(decision.VerdictDenyOpen))
	z := NewRetryDelay(-s, 0, nil, nil)
	assert.Zero(t, z.Draw(decision.VerdictDenyOpen))
	assert.Zero(t, z.Draw(decision.VerdictDenyBudget), "budget delay clamped down to max")
}
